//! The file as written: the TOML schema with the span of every value (for `file:line:column`
//! in errors), the settings a `[[peer]]` inherits from `[gateway]`, and the parsers of single
//! values (interface names, addresses, prefixes, MACs, ports, durations, paths).

use std::fmt;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d_proto::PortPolicy;
use serde::Deserialize;
use toml::Spanned;

pub(super) use super::source::Source;
use super::ConfigError;

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) gateway: Spanned<RawGateway>,
    pub(super) tcp: Option<Spanned<super::tcp::RawTcp>>,
    #[serde(default, rename = "peer")]
    pub(super) peers: Vec<Spanned<RawPeer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGateway {
    pub(super) role: Option<Spanned<String>>,
    pub(super) internal_interface: Option<Spanned<String>>,
    pub(super) external_interface: Spanned<String>,
    pub(super) tun_name: Option<Spanned<String>>,
    pub(super) control_socket: Option<Spanned<String>>,
    pub(super) external_next_hop: Option<Spanned<String>>,
    pub(super) rotation_secs: Option<Spanned<f64>>,
    pub(super) jitter: Option<Spanned<bool>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) aead: Option<Spanned<String>>,
    pub(super) derivation: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<toml::Value>>,
    pub(super) private_key_file: Option<Spanned<String>>,
    pub(super) rekey_secs: Option<Spanned<f64>>,
    pub(super) rekey_packets: Option<Spanned<i64>>,
    pub(super) router_advertisements: Option<Spanned<bool>>,
    pub(super) log_level: Option<Spanned<String>>,
    pub(super) interface_down_exit_secs: Option<Spanned<f64>>,
    pub(super) randomize_link: Option<Spanned<bool>>,
    /// The operator's acknowledgement that `plain` and `auth` peers carry the inner packet in
    /// clear, true addresses inside it included.
    pub(super) accept_clear_payload: Option<Spanned<bool>>,
    pub(super) state_dir: Option<Spanned<String>>,
    pub(super) metrics_listen: Option<Spanned<String>>,
    pub(super) workers: Option<Spanned<i64>>,
}

/// Settings that `[gateway]` gives for every peer and a `[[peer]]` may override. (Listed in
/// both sections rather than flattened: serde's flatten loses the spans that give line numbers.)
#[derive(Default, Clone)]
pub(super) struct RawStreamSettings {
    pub(super) rotation_secs: Option<Spanned<f64>>,
    pub(super) jitter: Option<Spanned<bool>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) aead: Option<Spanned<String>>,
    pub(super) derivation: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeer {
    pub(super) name: Spanned<String>,
    pub(super) local_host: Spanned<String>,
    pub(super) remote_host: Spanned<String>,
    pub(super) local_prefix: Option<Spanned<String>>,
    pub(super) remote_prefix: Option<Spanned<String>>,
    pub(super) local_mac: Option<Spanned<String>>,
    pub(super) remote_mac: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) key_file: Option<Spanned<String>>,
    pub(super) public_key: Option<Spanned<String>>,
    pub(super) preshared_key_file: Option<Spanned<String>>,
    pub(super) rotation_secs: Option<Spanned<f64>>,
    pub(super) jitter: Option<Spanned<bool>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) aead: Option<Spanned<String>>,
    pub(super) derivation: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<toml::Value>>,
    pub(super) host_id_out: Option<Spanned<super::tcp::RawHostId>>,
    pub(super) host_id_in: Option<Spanned<super::tcp::RawHostId>>,
}

pub(super) fn gateway_settings(g: &RawGateway) -> RawStreamSettings {
    RawStreamSettings {
        rotation_secs: g.rotation_secs.clone(),
        jitter: g.jitter.clone(),
        mode: g.mode.clone(),
        aead: g.aead.clone(),
        derivation: g.derivation.clone(),
        port: g.port.clone(),
    }
}

pub(super) fn peer_settings(p: &RawPeer) -> RawStreamSettings {
    RawStreamSettings {
        rotation_secs: p.rotation_secs.clone(),
        jitter: p.jitter.clone(),
        mode: p.mode.clone(),
        aead: p.aead.clone(),
        derivation: p.derivation.clone(),
        port: p.port.clone(),
    }
}

pub(super) fn merge(defaults: &RawStreamSettings, own: &RawStreamSettings) -> RawStreamSettings {
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

pub(super) fn interface_name(src: &Source, v: &Spanned<String>) -> Result<String, ConfigError> {
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

pub(super) fn address(src: &Source, v: &Spanned<String>) -> Result<Ipv6Addr, ConfigError> {
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

pub(super) fn prefix64(src: &Source, v: &Spanned<String>) -> Result<Ipv6Addr, ConfigError> {
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

pub(super) fn mac(src: &Source, v: &Spanned<String>) -> Result<[u8; 6], ConfigError> {
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

pub(super) fn parse_opt<T>(
    src: &Source,
    v: &Option<Spanned<String>>,
    default: T,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    match v {
        None => Ok(default),
        Some(s) => s.get_ref().parse().map_err(|e| src.err(s, e)),
    }
}

pub(super) fn ports(
    src: &Source,
    v: &Option<Spanned<toml::Value>>,
) -> Result<PortPolicy, ConfigError> {
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

pub(super) fn rotation(src: &Source, v: &Option<Spanned<f64>>) -> Result<Duration, ConfigError> {
    seconds(src, v, "rotation_secs", 10)
}

/// `workers`: data-plane threads, 1 to [`super::MAX_WORKERS`]; None when unset (one per online
/// CPU, [`super::worker_count`]). A bad count's error names its place.
pub(super) fn workers(
    src: &Source,
    v: Option<&Spanned<i64>>,
) -> Result<Option<usize>, ConfigError> {
    let max = super::MAX_WORKERS;
    v.map(|w| {
        usize::try_from(*w.get_ref())
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                src.err(
                    w,
                    format!("workers: the number of data-plane threads, 1 to {max} (unset: one per online CPU)"),
                )
            })
    })
    .transpose()
}

/// A duration setting in seconds (1 to 86400, millisecond resolution).
pub(super) fn seconds(
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
pub(super) fn relative_to(config: &Path, file: &str) -> PathBuf {
    let file = PathBuf::from(file);
    match config.parent() {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file,
    }
}

/// `metrics_listen`: the address and port of the Prometheus endpoint, in every role's table.
pub(super) fn metrics_listen(
    src: &Source,
    v: Option<&Spanned<String>>,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let Some(v) = v else {
        return Ok(None);
    };
    v.get_ref().parse().map(Some).map_err(|_| {
        src.err(
            v,
            format!(
                "metrics_listen {:?} is not an address and port, e.g. \"[::1]:9586\"",
                v.get_ref()
            ),
        )
    })
}
