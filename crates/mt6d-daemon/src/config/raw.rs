//! The file as written: the TOML schema with the span of every value (for `file:line:column`
//! in errors), the stream settings' keys (declared once for every section that has them), the
//! settings a `[[peer]]` inherits from `[gateway]`, and the parsers of single values (interface
//! names, addresses, prefixes, MACs, durations, paths).

use std::fmt;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Declares a section's TOML schema with the stream settings' keys after its own: the keys
/// `rotation_secs`, `jitter`, `mode`, `aead`, `derivation` and `port` and their TOML types are
/// written here once for `[gateway]`, `[[peer]]` and `[server]`, and validated once
/// ([`super::settings::StreamSettings`]). (Not a serde `flatten`: it loses the spans that give
/// line numbers, and `deny_unknown_fields` with it.)
macro_rules! with_stream_keys {
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_attr:meta])* $field_vis:vis $field:ident : $ty:ty,)*
        }
    ) => {
        $(#[$attr])*
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name {
            $($(#[$field_attr])* $field_vis $field: $ty,)*
            pub(super) rotation_secs: Option<toml::Spanned<f64>>,
            pub(super) jitter: Option<toml::Spanned<bool>>,
            pub(super) mode: Option<toml::Spanned<String>>,
            pub(super) aead: Option<toml::Spanned<String>>,
            pub(super) derivation: Option<toml::Spanned<String>>,
            pub(super) port: Option<toml::Spanned<toml::Value>>,
        }

        impl $name {
            /// The stream settings as written in this section.
            pub(super) fn stream_settings(&self) -> $crate::config::raw::RawStreamSettings {
                $crate::config::raw::RawStreamSettings {
                    rotation_secs: self.rotation_secs.clone(),
                    jitter: self.jitter.clone(),
                    mode: self.mode.clone(),
                    aead: self.aead.clone(),
                    derivation: self.derivation.clone(),
                    port: self.port.clone(),
                }
            }
        }
    };
}
pub(super) use with_stream_keys;

with_stream_keys! {
    pub(super) struct RawGateway {
        pub(super) role: Option<Spanned<String>>,
        pub(super) internal_interface: Option<Spanned<String>>,
        pub(super) external_interface: Spanned<String>,
        pub(super) tun_name: Option<Spanned<String>>,
        pub(super) control_socket: Option<Spanned<String>>,
        pub(super) external_next_hop: Option<Spanned<String>>,
        pub(super) private_key_file: Option<Spanned<String>>,
        pub(super) rekey_secs: Option<Spanned<f64>>,
        pub(super) rekey_packets: Option<Spanned<i64>>,
        pub(super) router_advertisements: Option<Spanned<bool>>,
        pub(super) log_level: Option<Spanned<String>>,
        pub(super) interface_down_exit_secs: Option<Spanned<f64>>,
        pub(super) randomize_link: Option<Spanned<bool>>,
        /// The operator's acknowledgement that `plain` and `auth` peers carry the inner packet
        /// in clear, true addresses inside it included.
        pub(super) accept_clear_payload: Option<Spanned<bool>>,
        pub(super) state_dir: Option<Spanned<String>>,
        pub(super) metrics_listen: Option<Spanned<String>>,
        pub(super) workers: Option<Spanned<i64>>,
    }
}

/// The stream settings of one section as written, unvalidated: what `[gateway]` gives every
/// peer and a `[[peer]]` may override ([`merge`]).
#[derive(Default, Clone)]
pub(super) struct RawStreamSettings {
    pub(super) rotation_secs: Option<Spanned<f64>>,
    pub(super) jitter: Option<Spanned<bool>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) aead: Option<Spanned<String>>,
    pub(super) derivation: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<toml::Value>>,
}

with_stream_keys! {
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
        pub(super) host_id_out: Option<Spanned<super::tcp::RawHostId>>,
        pub(super) host_id_in: Option<Spanned<super::tcp::RawHostId>>,
    }
}

/// A peer's stream settings: its own where it gives them, else `[gateway]`'s.
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

/// A duration setting in seconds (1 to 86400, millisecond resolution).
pub(super) fn seconds(
    src: &Source,
    v: Option<&Spanned<f64>>,
    name: &str,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(default),
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
