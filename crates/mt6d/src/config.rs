//! The gateway's configuration file: the TOML schema, parsing with file and line numbers in every
//! error, and validation into the protocol crate's [`StreamConfig`]s.
//!
//! Everything is validated here, before the daemon touches the OS, so that a bad file never
//! half-applies (developers' brief; `mt6d check -c FILE` runs exactly this code). The schema is
//! documented with a full example in `docs/CONFIG.md` and `examples/gateway-a.toml`.

use std::collections::HashSet;
use std::fmt;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d_proto::handshake::{link_key, HandshakeConfig, PrivateKey, Psk};
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Mode, PortPolicy, SessionKey, Stream, StreamConfig,
};

use crate::keys;
use serde::Deserialize;
use toml::Spanned;

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

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

/// Settings of the node itself (`[gateway]`, whichever its role).
#[derive(Debug, Clone)]
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
}

/// Default `state_dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/mt6d";

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    gateway: Spanned<RawGateway>,
    #[serde(default, rename = "peer")]
    peers: Vec<Spanned<RawPeer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    role: Option<Spanned<String>>,
    internal_interface: Option<Spanned<String>>,
    external_interface: Spanned<String>,
    tun_name: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
    external_next_hop: Option<Spanned<String>>,
    rotation_secs: Option<Spanned<f64>>,
    jitter: Option<Spanned<bool>>,
    mode: Option<Spanned<String>>,
    aead: Option<Spanned<String>>,
    derivation: Option<Spanned<String>>,
    port: Option<Spanned<toml::Value>>,
    private_key_file: Option<Spanned<String>>,
    rekey_secs: Option<Spanned<f64>>,
    rekey_packets: Option<Spanned<i64>>,
    router_advertisements: Option<Spanned<bool>>,
    log_level: Option<Spanned<String>>,
    interface_down_exit_secs: Option<Spanned<f64>>,
    randomize_link: Option<Spanned<bool>>,
    state_dir: Option<Spanned<String>>,
}

/// Settings that `[gateway]` gives for every peer and a `[[peer]]` may override. (Listed in
/// both sections rather than flattened: serde's flatten loses the spans that give line numbers.)
#[derive(Default, Clone)]
struct RawStreamSettings {
    rotation_secs: Option<Spanned<f64>>,
    jitter: Option<Spanned<bool>>,
    mode: Option<Spanned<String>>,
    aead: Option<Spanned<String>>,
    derivation: Option<Spanned<String>>,
    port: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: Spanned<String>,
    local_host: Spanned<String>,
    remote_host: Spanned<String>,
    local_prefix: Option<Spanned<String>>,
    remote_prefix: Option<Spanned<String>>,
    local_mac: Option<Spanned<String>>,
    remote_mac: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    public_key: Option<Spanned<String>>,
    preshared_key_file: Option<Spanned<String>>,
    rotation_secs: Option<Spanned<f64>>,
    jitter: Option<Spanned<bool>>,
    mode: Option<Spanned<String>>,
    aead: Option<Spanned<String>>,
    derivation: Option<Spanned<String>>,
    port: Option<Spanned<toml::Value>>,
}

/// Turns byte offsets into the `file:line:column` a person can open.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn err_at(&self, span: std::ops::Range<usize>, message: impl fmt::Display) -> ConfigError {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = start - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        ConfigError::At {
            path: self.path.to_path_buf(),
            line,
            column,
            message: message.to_string(),
        }
    }

    fn err<T>(&self, item: &Spanned<T>, message: impl fmt::Display) -> ConfigError {
        self.err_at(item.span(), message)
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
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
        Ok(config)
    }

    /// Validates configuration text; `path` names the file in errors and anchors relative
    /// `key_file` paths.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let src = Source { path, text };
        let raw: RawConfig = toml::from_str(text).map_err(|e| match e.span() {
            Some(span) => src.err_at(span, e.message()),
            None => ConfigError::File {
                path: path.to_path_buf(),
                message: e.message().to_string(),
            },
        })?;
        let section = GatewaySection::parse(&src, &raw.gateway)?;
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
        }
        Ok(Config {
            path: path.to_path_buf(),
            gateway: section.finish(path, raw.gateway.get_ref(), seen.host_address)?,
            peers,
        })
    }
}

/// The `[gateway]` section validated, before the peers say which address a host protects.
struct GatewaySection {
    host_role: bool,
    /// None in host mode.
    internal_interface: Option<String>,
    external_interface: String,
    tun_name: String,
    router_advertisements: bool,
    log_level: Option<log::LevelFilter>,
    interface_down_exit: Duration,
    control_socket: PathBuf,
    external_next_hop: Option<Ipv6Addr>,
    /// What every peer with a `public_key` uses for its handshake.
    private_key: Option<PrivateKey>,
    rekey_after: Duration,
    rekey_packets: Option<u64>,
    state_dir: PathBuf,
}

impl GatewaySection {
    /// Each setting in the order of the checks, so that of several mistakes the same one is
    /// reported first.
    fn parse(src: &Source, section: &Spanned<RawGateway>) -> Result<GatewaySection, ConfigError> {
        let gw = section.get_ref();
        let host_role = host_role(src, gw)?;
        let (internal_interface, external_interface, tun_name) =
            interfaces(src, section, host_role)?;
        let router_advertisements = router_advertisements(src, gw, host_role)?;
        let log_level = log_level(src, gw)?;
        let interface_down_exit = interface_down_exit(src, gw)?;
        let control_socket = control_socket(src, section, &tun_name)?;
        let external_next_hop =
            match &gw.external_next_hop {
                None => None,
                Some(v) => Some(v.get_ref().parse::<Ipv6Addr>().map_err(|_| {
                    src.err(v, format!("{:?} is not an IPv6 address", v.get_ref()))
                })?),
            };
        let private_key = gw
            .private_key_file
            .as_ref()
            .map(|f| {
                keys::read_private_key(&relative_to(src.path, f.get_ref()))
                    .map_err(|e| src.err(f, e))
            })
            .transpose()?;
        let rekey_after = seconds(src, &gw.rekey_secs, "rekey_secs", DEFAULT_REKEY_SECS)?;
        let rekey_packets = match &gw.rekey_packets {
            None => None,
            Some(v) => Some(
                u64::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (1000..=CHACHA_REKEY_PACKETS).contains(n))
                    .ok_or_else(|| src.err(v, "rekey_packets out of range (1000 to 2^36)"))?,
            ),
        };
        let state_dir = match &gw.state_dir {
            Some(d) if d.get_ref().is_empty() => {
                return Err(src.err(d, "state_dir is empty"));
            }
            Some(d) => relative_to(src.path, d.get_ref()),
            None => PathBuf::from(DEFAULT_STATE_DIR),
        };
        Ok(GatewaySection {
            host_role,
            internal_interface,
            external_interface,
            tun_name,
            router_advertisements,
            log_level,
            interface_down_exit,
            control_socket,
            external_next_hop,
            private_key,
            rekey_after,
            rekey_packets,
            state_dir,
        })
    }

    /// The gateway's settings, once the peers named the host's address (host mode).
    fn finish(
        self,
        path: &Path,
        gw: &RawGateway,
        host_address: Option<Ipv6Addr>,
    ) -> Result<GatewayConfig, ConfigError> {
        Ok(GatewayConfig {
            role: match (self.internal_interface, host_address) {
                (Some(internal_interface), _) => Role::Gateway { internal_interface },
                (None, Some(local_host)) => Role::Host { local_host },
                // Host role without an address is impossible: there is at least one peer.
                (None, None) => {
                    return Err(ConfigError::File {
                        path: path.to_path_buf(),
                        message: "role = \"host\" needs a [[peer]] with local_host".into(),
                    })
                }
            },
            external_interface: self.external_interface,
            tun_name: self.tun_name,
            control_socket: self.control_socket,
            external_next_hop: self.external_next_hop,
            router_advertisements: self.router_advertisements,
            log_level: self.log_level,
            interface_down_exit: self.interface_down_exit,
            randomize_link: gw.randomize_link.as_ref().is_some_and(|v| *v.get_ref()),
            state_dir: self.state_dir,
        })
    }
}

/// `role`: true for `"host"`.
fn host_role(src: &Source, gw: &RawGateway) -> Result<bool, ConfigError> {
    match &gw.role {
        None => Ok(false),
        Some(r) => match r.get_ref().as_str() {
            "gateway" => Ok(false),
            "host" => Ok(true),
            other => Err(src.err(
                r,
                format!("role {other:?}: \"gateway\" (in front of protected hosts) or \"host\" (on the protected host itself)"),
            )),
        },
    }
}

/// (internal interface, external interface, TUN name), all different; no internal interface in
/// host mode.
fn interfaces(
    src: &Source,
    section: &Spanned<RawGateway>,
    host_role: bool,
) -> Result<(Option<String>, String, String), ConfigError> {
    let gw = section.get_ref();
    let internal_interface = match (&gw.internal_interface, host_role) {
        (Some(name), false) => Some(interface_name(src, name)?),
        (None, true) => None,
        (Some(name), true) => {
            return Err(src.err(
                name,
                "role = \"host\" has no internal interface: the true address goes on the TUN device; remove internal_interface",
            ))
        }
        (None, false) => {
            return Err(src.err(
                section,
                "[gateway] needs internal_interface = \"IFACE\" (towards the protected hosts), or role = \"host\" when mt6d runs on the protected host itself",
            ))
        }
    };
    let external_interface = interface_name(src, &gw.external_interface)?;
    if internal_interface.as_deref() == Some(external_interface.as_str()) {
        return Err(src.err(
            &gw.external_interface,
            "external_interface must differ from internal_interface",
        ));
    }
    let tun_name = match &gw.tun_name {
        Some(name) => interface_name(src, name)?,
        None => "mt6d0".to_string(),
    };
    if internal_interface.as_deref() == Some(tun_name.as_str()) || tun_name == external_interface {
        return Err(src.err(
            gw.tun_name.as_ref().unwrap_or(&gw.external_interface),
            format!("tun_name {tun_name:?} is already used by another interface setting"),
        ));
    }
    Ok((internal_interface, external_interface, tun_name))
}

/// `router_advertisements`: on by default in gateway mode, refused in host mode.
fn router_advertisements(
    src: &Source,
    gw: &RawGateway,
    host_role: bool,
) -> Result<bool, ConfigError> {
    // Host mode has no internal link to be the router of: the host's own stack takes the
    // tunnel MTU from the TUN device, and its kernel reads the upstream router's MTU option
    // on the external interface itself (it does not forward), which the ICMP thread follows.
    match &gw.router_advertisements {
        Some(v) if host_role && *v.get_ref() => Err(src.err(
            v,
            "role = \"host\" has no internal link to send Router Advertisements on: remove router_advertisements",
        )),
        Some(v) => Ok(*v.get_ref()),
        None => Ok(!host_role),
    }
}

fn log_level(src: &Source, gw: &RawGateway) -> Result<Option<log::LevelFilter>, ConfigError> {
    match &gw.log_level {
        Some(v) => Ok(Some(parse_log_level(v.get_ref()).ok_or_else(|| {
            src.err(
                v,
                format!(
                    "log_level {:?}: one of error, warn, info, debug, trace, off",
                    v.get_ref()
                ),
            )
        })?)),
        None => Ok(None),
    }
}

fn interface_down_exit(src: &Source, gw: &RawGateway) -> Result<Duration, ConfigError> {
    match &gw.interface_down_exit_secs {
        Some(v) => {
            let secs = *v.get_ref();
            if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                return Err(src.err(
                    v,
                    "interface_down_exit_secs: seconds, more than 0 and at most 86400",
                ));
            }
            Ok(Duration::from_secs_f64(secs))
        }
        None => Ok(Duration::from_secs(30)),
    }
}

fn control_socket(
    src: &Source,
    section: &Spanned<RawGateway>,
    tun_name: &str,
) -> Result<PathBuf, ConfigError> {
    let gw = section.get_ref();
    let control_socket = match &gw.control_socket {
        Some(p) => PathBuf::from(p.get_ref()),
        None => default_control_socket(tun_name),
    };
    // The daemon replaces a dead socket at this path; anything else there is someone's
    // file and is refused now rather than deleted at start-up.
    if let Err(why) = crate::control::refuse_non_socket(&control_socket) {
        return Err(match &gw.control_socket {
            Some(p) => src.err(p, why),
            None => src.err(section, why),
        });
    }
    Ok(control_socket)
}

/// What the peers validated so far claim, for the checks across peers.
#[derive(Default)]
struct PeersSeen {
    names: HashSet<String>,
    pairs: HashSet<(Ipv6Addr, Ipv6Addr)>,
    /// Host mode: the one address of this host, from the first peer; the others must agree.
    host_address: Option<Ipv6Addr>,
    /// Pre-shared keys already used, with the true addresses of their streams: a key may serve
    /// several streams only if no true address is shared (docs/PROTOCOL.md §4.3).
    pre_shared: Vec<(zeroize::Zeroizing<Vec<u8>>, Ipv6Addr, Ipv6Addr, String)>,
}

/// One `[[peer]]` whose name and true addresses passed, with its merged stream settings.
struct PeerDraft<'a> {
    raw: &'a Spanned<RawPeer>,
    name: String,
    local_true: Ipv6Addr,
    remote_true: Ipv6Addr,
    settings: RawStreamSettings,
    mode: Mode,
    aead: AeadAlg,
}

/// One `[[peer]]`: its name and addresses, its keys, its stream; then the stream (and its
/// handshake) built once, so that anything the protocol layer rejects is reported here,
/// against this peer's lines.
fn parse_peer(
    src: &Source,
    gw: &RawGateway,
    section: &GatewaySection,
    peer: &Spanned<RawPeer>,
    seen: &mut PeersSeen,
) -> Result<PeerConfig, ConfigError> {
    let p = peer.get_ref();
    let (name, local_true, remote_true) = peer_hosts(src, p, section.host_role, seen)?;
    let settings = merge(&gateway_settings(gw), &peer_settings(p));
    let draft = PeerDraft {
        raw: peer,
        name,
        local_true,
        remote_true,
        mode: parse_opt(src, &settings.mode, Mode::default())?,
        aead: parse_opt(src, &settings.aead, AeadAlg::default())?,
        settings,
    };
    let (key, keying) = match &p.public_key {
        None => pre_shared_keying(src, &draft, &mut seen.pre_shared)?,
        Some(public) => handshake_keying(src, gw, section, &draft, public)?,
    };
    let stream = stream_config(src, &draft, key)?;
    let name = draft.name;
    Stream::new(stream.clone()).map_err(|e| src.err(&p.name, format!("peer {name:?}: {e}")))?;
    if let Keying::Handshake(hs) = &keying {
        mt6d_proto::handshake::Handshake::new(hs.clone())
            .map_err(|e| src.err(&p.name, format!("peer {name:?}: {e}")))?;
    }
    Ok(PeerConfig {
        name,
        stream,
        keying,
    })
}

/// (name, local true address, remote true address) of a peer, checked against the peers before
/// it: names unique, each pair of hosts carried once, one local address in host mode.
fn peer_hosts(
    src: &Source,
    p: &RawPeer,
    host_role: bool,
    seen: &mut PeersSeen,
) -> Result<(String, Ipv6Addr, Ipv6Addr), ConfigError> {
    let name = p.name.get_ref().trim().to_string();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(src.err(
            &p.name,
            "peer name must be non-empty and use only letters, digits, '-', '_' and '.'",
        ));
    }
    if !seen.names.insert(name.clone()) {
        return Err(src.err(&p.name, format!("duplicate peer name {name:?}")));
    }
    let local_true = address(src, &p.local_host)?;
    let remote_true = address(src, &p.remote_host)?;
    if local_true == remote_true {
        return Err(src.err(&p.remote_host, "remote_host equals local_host"));
    }
    if host_role {
        match seen.host_address {
            None => seen.host_address = Some(local_true),
            Some(first) if first != local_true => {
                return Err(src.err(
                    &p.local_host,
                    format!("role = \"host\" protects one address, this host's own: every peer's local_host must be {first}"),
                ))
            }
            Some(_) => {}
        }
    }
    if !seen.pairs.insert((local_true, remote_true)) {
        return Err(src.err(
            &p.remote_host,
            format!("another peer already carries {local_true} <-> {remote_true}: each pair of hosts belongs to one peer"),
        ));
    }
    Ok((name, local_true, remote_true))
}

/// A pre-shared session key (`key` or `key_file`), refused if an earlier stream with a true
/// address in common uses the same key.
fn pre_shared_keying(
    src: &Source,
    draft: &PeerDraft,
    pre_shared: &mut Vec<(zeroize::Zeroizing<Vec<u8>>, Ipv6Addr, Ipv6Addr, String)>,
) -> Result<(SessionKey, Keying), ConfigError> {
    let p = draft.raw.get_ref();
    let (name, local_true, remote_true) = (&draft.name, draft.local_true, draft.remote_true);
    if let Some(f) = &p.preshared_key_file {
        return Err(src.err(
            f,
            "preshared_key_file adds to a handshake: it needs public_key (with key/key_file the pre-shared session key is used directly)",
        ));
    }
    let key = peer_key(src, draft.raw)?;
    for (k, l, r, other) in pre_shared.iter() {
        let shared = [*l, *r]
            .into_iter()
            .find(|a| *a == local_true || *a == remote_true);
        if k[..] == *key.as_bytes() {
            if let Some(a) = shared {
                return Err(src.err(
                    p.key.as_ref().or(p.key_file.as_ref()).unwrap_or(&p.name),
                    format!("peer {name:?} uses the same pre-shared key as peer {other:?} and both streams carry {a}: their hashed addresses and ports for {a} would be the same in every epoch, linking the two conversations; give each peer its own key (`mt6d genpsk`)"),
                ));
            }
        }
    }
    pre_shared.push((
        zeroize::Zeroizing::new(key.as_bytes().to_vec()),
        local_true,
        remote_true,
        name.clone(),
    ));
    Ok((key, Keying::PreShared))
}

/// Handshake keys: this gateway's private key, the peer's `public_key` and an optional
/// `preshared_key_file` give the link key (docs/PROTOCOL.md §9.1) and the handshake settings.
fn handshake_keying(
    src: &Source,
    gw: &RawGateway,
    section: &GatewaySection,
    draft: &PeerDraft,
    public: &Spanned<String>,
) -> Result<(SessionKey, Keying), ConfigError> {
    let p = draft.raw.get_ref();
    let (name, mode, aead) = (&draft.name, draft.mode, draft.aead);
    if let Some(k) = p.key.as_ref().or(p.key_file.as_ref()) {
        return Err(src.err(
            k,
            "give either public_key (handshake) or key/key_file (pre-shared session key), not both",
        ));
    }
    let Some(private) = &section.private_key else {
        return Err(src.err(
            public,
            "public_key needs [gateway] private_key_file = \"PATH\" (create one with `mt6d keygen PATH`)",
        ));
    };
    if mode == Mode::Plain {
        return Err(src.err(
            public,
            "mode \"plain\" has no counter or tag, so it cannot use handshake keys; use key/key_file (pre-shared) or mode \"auth\"/\"encrypt\"",
        ));
    }
    let remote_public =
        keys::public_key(public.get_ref(), "public_key").map_err(|e| src.err(public, e))?;
    let psk = match &p.preshared_key_file {
        None => Psk::none(),
        Some(f) => {
            let file = relative_to(src.path, f.get_ref());
            let text = keys::read_secret_file(&file).map_err(|e| src.err(f, e))?;
            let what = format!("preshared key file {}", file.display());
            Psk::from_bytes(
                *keys::decode32(&text, &what, "pre-shared key").map_err(|e| src.err(f, e))?,
            )
        }
    };
    let key = link_key(private, &remote_public, &psk)
        .map_err(|e| src.err(public, format!("peer {name:?}: {e}")))?;
    let limit = rekey_packets_limit(aead);
    let rekey_after_packets = match (&gw.rekey_packets, section.rekey_packets) {
        (Some(v), Some(n)) if n > limit => {
            return Err(src.err(
                v,
                format!("rekey_packets {n} is beyond the {aead} limit of {limit} packets per key (RFC 9001 §6.6) used by peer {name:?}"),
            ))
        }
        (_, Some(n)) => n,
        (_, None) => limit,
    };
    let hs = HandshakeConfig {
        local_private: private.clone(),
        remote_public,
        psk,
        mode,
        aead,
        local_true: draft.local_true,
        remote_true: draft.remote_true,
        rekey_after: section.rekey_after,
        rekey_after_packets,
    };
    Ok((key, Keying::Handshake(hs)))
}

/// The protocol crate's stream settings of a peer: its endpoints (prefixes and MACs), key,
/// derivation, ports, mode, AEAD, rotation and jitter.
fn stream_config(
    src: &Source,
    draft: &PeerDraft,
    key: SessionKey,
) -> Result<StreamConfig, ConfigError> {
    let p = draft.raw.get_ref();
    let settings = &draft.settings;
    Ok(StreamConfig {
        local: Endpoint {
            true_addr: draft.local_true,
            external_prefix: p
                .local_prefix
                .as_ref()
                .map(|s| prefix64(src, s))
                .transpose()?,
            mac: p.local_mac.as_ref().map(|s| mac(src, s)).transpose()?,
        },
        remote: Endpoint {
            true_addr: draft.remote_true,
            external_prefix: p
                .remote_prefix
                .as_ref()
                .map(|s| prefix64(src, s))
                .transpose()?,
            mac: p.remote_mac.as_ref().map(|s| mac(src, s)).transpose()?,
        },
        key,
        derivation: parse_opt(src, &settings.derivation, Derivation::default())?,
        ports: ports(src, &settings.port)?,
        mode: draft.mode,
        aead: draft.aead,
        rotation: rotation(src, &settings.rotation_secs)?,
        jitter: settings.jitter.as_ref().is_some_and(|j| *j.get_ref()),
    })
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

fn gateway_settings(g: &RawGateway) -> RawStreamSettings {
    RawStreamSettings {
        rotation_secs: g.rotation_secs.clone(),
        jitter: g.jitter.clone(),
        mode: g.mode.clone(),
        aead: g.aead.clone(),
        derivation: g.derivation.clone(),
        port: g.port.clone(),
    }
}

fn peer_settings(p: &RawPeer) -> RawStreamSettings {
    RawStreamSettings {
        rotation_secs: p.rotation_secs.clone(),
        jitter: p.jitter.clone(),
        mode: p.mode.clone(),
        aead: p.aead.clone(),
        derivation: p.derivation.clone(),
        port: p.port.clone(),
    }
}

fn merge(defaults: &RawStreamSettings, own: &RawStreamSettings) -> RawStreamSettings {
    RawStreamSettings {
        rotation_secs: own
            .rotation_secs
            .clone()
            .or_else(|| defaults.rotation_secs.clone()),
        jitter: own.jitter.clone().or_else(|| defaults.jitter.clone()),
        mode: own.mode.clone().or_else(|| defaults.mode.clone()),
        aead: own.aead.clone().or_else(|| defaults.aead.clone()),
        derivation: own
            .derivation
            .clone()
            .or_else(|| defaults.derivation.clone()),
        port: own.port.clone().or_else(|| defaults.port.clone()),
    }
}

fn interface_name(src: &Source, v: &Spanned<String>) -> Result<String, ConfigError> {
    let name = v.get_ref();
    if name.is_empty()
        || name.len() > IFNAME_MAX
        || name.contains('/')
        || name.contains(char::is_whitespace)
    {
        return Err(src.err(
            v,
            format!("{name:?} is not a valid interface name (1-{IFNAME_MAX} characters, no '/' or spaces)"),
        ));
    }
    Ok(name.clone())
}

fn address(src: &Source, v: &Spanned<String>) -> Result<Ipv6Addr, ConfigError> {
    let addr: Ipv6Addr = v
        .get_ref()
        .parse()
        .map_err(|_| src.err(v, format!("{:?} is not an IPv6 address", v.get_ref())))?;
    if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() {
        return Err(src.err(v, format!("{addr} cannot be a protected host's address")));
    }
    if addr.segments()[0] & 0xffc0 == 0xfe80 {
        return Err(src.err(
            v,
            format!(
                "{addr} is link-local: a protected host needs a global or unique-local address"
            ),
        ));
    }
    Ok(addr)
}

fn prefix64(src: &Source, v: &Spanned<String>) -> Result<Ipv6Addr, ConfigError> {
    let text = v.get_ref();
    let (addr, len) = text.split_once('/').ok_or_else(|| {
        src.err(
            v,
            format!("{text:?} is not a prefix: write it as ADDRESS/64"),
        )
    })?;
    if len != "64" {
        return Err(src.err(
            v,
            format!("prefix length /{len} not supported: hashed addresses take a /64 (their low 64 bits are the hash)"),
        ));
    }
    let addr: Ipv6Addr = addr
        .parse()
        .map_err(|_| src.err(v, format!("{addr:?} is not an IPv6 address")))?;
    let seg = addr.segments();
    Ok(Ipv6Addr::new(seg[0], seg[1], seg[2], seg[3], 0, 0, 0, 0))
}

fn mac(src: &Source, v: &Spanned<String>) -> Result<[u8; 6], ConfigError> {
    let text = v.get_ref();
    let mut out = [0u8; 6];
    let parts: Vec<&str> = text.split([':', '-']).collect();
    if parts.len() != 6 {
        return Err(src.err(v, format!("{text:?} is not a MAC address (six hex bytes)")));
    }
    for (slot, part) in out.iter_mut().zip(parts) {
        *slot = u8::from_str_radix(part, 16)
            .map_err(|_| src.err(v, format!("{text:?} is not a MAC address (six hex bytes)")))?;
    }
    Ok(out)
}

fn parse_opt<T>(src: &Source, v: &Option<Spanned<String>>, default: T) -> Result<T, ConfigError>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    match v {
        None => Ok(default),
        Some(s) => s.get_ref().parse().map_err(|e| src.err(s, e)),
    }
}

fn ports(src: &Source, v: &Option<Spanned<toml::Value>>) -> Result<PortPolicy, ConfigError> {
    match v {
        None => Ok(PortPolicy::default()),
        Some(s) => match s.get_ref() {
            toml::Value::String(h) if h == "hopping" => Ok(PortPolicy::Hopping),
            toml::Value::Integer(p) if (1024..=65535).contains(p) => {
                // The range check above makes the conversion exact.
                Ok(PortPolicy::Fixed(*p as u16))
            }
            _ => Err(src.err(
                s,
                "port must be \"hopping\" (a new port every epoch) or a fixed port number 1024-65535",
            )),
        },
    }
}

fn rotation(src: &Source, v: &Option<Spanned<f64>>) -> Result<Duration, ConfigError> {
    seconds(src, v, "rotation_secs", 10)
}

/// A duration setting in seconds (1 to 86400, millisecond resolution).
fn seconds(
    src: &Source,
    v: &Option<Spanned<f64>>,
    name: &str,
    default_secs: u64,
) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(Duration::from_secs(default_secs)),
        Some(s) => {
            let secs = *s.get_ref();
            if !(1.0..=86_400.0).contains(&secs) {
                return Err(src.err(s, format!("{name} {secs} out of range (1 to 86400)")));
            }
            Ok(Duration::from_millis((secs * 1000.0).round() as u64))
        }
    }
}

/// A path from the file, relative to the configuration file's directory unless absolute.
fn relative_to(config: &Path, file: &str) -> PathBuf {
    let file = PathBuf::from(file);
    match config.parent() {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file,
    }
}

/// Secrets written into the config itself (a peer's `key = "..."`) are refused when group or
/// others can read the file (`mode` & 0o077), as key files are ([`keys::read_secret_file`]);
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

fn peer_key(src: &Source, peer: &Spanned<RawPeer>) -> Result<SessionKey, ConfigError> {
    let p = peer.get_ref();
    let (text, at) = match (&p.key, &p.key_file) {
        (Some(_), Some(f)) => return Err(src.err(f, "give either key or key_file, not both")),
        (None, None) => {
            return Err(src.err(
                &p.name,
                "peer has no key: set public_key = \"BASE64\" (the peer's `mt6d pubkey`), or a pre-shared key = \"BASE64\" / key_file = \"PATH\" (`mt6d genpsk`)",
            ))
        }
        (Some(k), None) => (zeroize::Zeroizing::new(k.get_ref().clone()), k),
        (None, Some(f)) => {
            let file = relative_to(src.path, f.get_ref());
            (keys::read_secret_file(&file).map_err(|e| src.err(f, e))?, f)
        }
    };
    let bytes = keys::decode(&text, "key").map_err(|e| src.err(at, e))?;
    SessionKey::from_bytes(&bytes).map_err(|e| src.err(at, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        let text = example().replace("rotation_secs = 1", "rotation_secs = 1\nmode = \"auth\"")
            + "mode = \"plain\"\nport = 4500\n";
        let cfg = parse(&text).expect("parses");
        assert_eq!(cfg.peers[0].stream.mode, Mode::Plain);
        assert_eq!(cfg.peers[0].stream.ports, PortPolicy::Fixed(4500));
    }

    #[test]
    fn bad_address_names_file_line_and_column() {
        let text = example().replace("2001:db8:1::b", "2001:db8:1::zz");
        let err = parse(&text).expect_err("must fail").to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:10:15:"), "{err}");
        assert!(err.contains("not an IPv6 address"), "{err}");
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

    /// The examples shipped in examples/ stay valid.
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
            "rotation_secs = 1\nmode = \"plain\"\n",
        );
        assert!(at(&plain).expect_err("plain").to_string().contains("plain"));
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

    /// Issue finding 1: two peers sharing a key file shared a data key. Data keys now bind the
    /// stream; a key is refused only where its streams share a true address (their hashed
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

    /// Issue finding 7: the default packet budget stays within the AEAD's limit (RFC 9001 §6.6).
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
                include_str!("../../../examples/gateway-a.toml"),
            ),
            (
                "gateway-b.toml",
                include_str!("../../../examples/gateway-b.toml"),
            ),
            ("host-a.toml", include_str!("../../../examples/host-a.toml")),
        ] {
            let cfg =
                Config::parse(&dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.peers.len(), 1, "{name}");
            assert_eq!(cfg.gateway.is_host(), name.starts_with("host"), "{name}");
        }
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
