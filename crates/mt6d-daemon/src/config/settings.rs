//! The settings several sections share, each defined once: its key, its default, its
//! validation and the error a person reads (file:line:column, the key, what was expected).
//!
//! The keys' TOML types are the fields of the raw sections (`raw.rs`, `server.rs`, `relay.rs`);
//! the stream settings' keys are declared once for every section that has them by
//! `raw::with_stream_keys`. What a role does with a setting (the gateway's peers
//! inherit the stream settings from `[gateway]`, a relay's links are always `encrypt`) stays
//! with the role's section; how a value is read does not.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use mt6d_proto::handshake::PrivateKey;
use mt6d_proto::{AeadAlg, Derivation, Endpoint, Mode, PortPolicy, SessionKey, StreamConfig};
use toml::Spanned;

use super::raw::{interface_name, parse_opt, relative_to, seconds, RawStreamSettings, Source};
use super::{parse_log_level, ConfigError, DEFAULT_REKEY_SECS, DEFAULT_STATE_DIR, MAX_WORKERS};
use crate::keys;

/// Default `rotation_secs`: the protocol's default rotation interval (10 s).
pub const DEFAULT_ROTATION: Duration = StreamConfig::DEFAULT_ROTATION;
/// Default `jitter` of a gateway's peers and a server's clients: off.
pub const DEFAULT_JITTER: bool = false;
/// Default `jitter` of a relay's links and end-to-end peers: on (a relay network carries many
/// streams between few nodes, whose common epoch boundaries would otherwise line up).
pub const DEFAULT_RELAY_JITTER: bool = true;
/// Default `mtu` of the server and relay roles: the external path's MTU.
pub const DEFAULT_MTU: u16 = 1500;
/// Default `interface_down_exit_secs`.
pub const DEFAULT_INTERFACE_DOWN_EXIT: Duration = Duration::from_secs(30);

/// How a stream is carried: `rotation_secs`, `jitter`, `mode`, `aead`, `derivation` and
/// `port`, validated. The gateway's peers (each with `[gateway]`'s as defaults), the server's
/// clients and a relay's links and end-to-end peers are all built from one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// `rotation_secs`: the epoch length (1 s to 86400 s, millisecond resolution).
    pub rotation: Duration,
    /// `jitter`: key-derived jitter of the epoch boundaries (docs/PROTOCOL.md §3).
    pub jitter: bool,
    /// `mode`: encrypt (default), auth or plain.
    pub mode: Mode,
    /// `aead`: the AEAD of auth and encrypt.
    pub aead: AeadAlg,
    /// `derivation`: how hashed addresses are derived.
    pub derivation: Derivation,
    /// `port`: `"hopping"` (default) or a fixed port 1024-65535.
    pub ports: PortPolicy,
}

impl StreamSettings {
    /// Validates the stream settings as written; an unset one takes its default (`jitter`'s is
    /// the role's: off for gateways and servers, on for relays). Each error names the key's
    /// place.
    pub(super) fn parse(
        src: &Source,
        raw: &RawStreamSettings,
        jitter_default: bool,
    ) -> Result<StreamSettings, ConfigError> {
        Ok(StreamSettings {
            mode: parse_opt(src, &raw.mode, Mode::default())?,
            aead: parse_opt(src, &raw.aead, AeadAlg::default())?,
            derivation: parse_opt(src, &raw.derivation, Derivation::default())?,
            ports: ports(src, raw.port.as_ref())?,
            rotation: rotation(src, raw.rotation_secs.as_ref())?,
            jitter: raw.jitter.as_ref().map_or(jitter_default, |j| *j.get_ref()),
        })
    }

    /// The protocol crate's stream between `local` and `remote` with these settings.
    pub fn stream(&self, local: Endpoint, remote: Endpoint, key: SessionKey) -> StreamConfig {
        StreamConfig {
            local,
            remote,
            key,
            derivation: self.derivation,
            ports: self.ports,
            mode: self.mode,
            aead: self.aead,
            rotation: self.rotation,
            jitter: self.jitter,
        }
    }
}

/// `rotation_secs`.
pub(super) fn rotation(src: &Source, v: Option<&Spanned<f64>>) -> Result<Duration, ConfigError> {
    seconds(src, v, "rotation_secs", DEFAULT_ROTATION)
}

/// `port`: `"hopping"` or a fixed port number 1024-65535.
fn ports(src: &Source, v: Option<&Spanned<toml::Value>>) -> Result<PortPolicy, ConfigError> {
    let Some(s) = v else {
        return Ok(PortPolicy::default());
    };
    match s.get_ref() {
        toml::Value::String(h) if h == "hopping" => Ok(PortPolicy::Hopping),
        toml::Value::Integer(p) if (1024..=65535).contains(p) => {
            // The range check above makes the conversion exact.
            Ok(PortPolicy::Fixed(*p as u16))
        }
        _ => Err(src.err(
            s,
            "port must be \"hopping\" (a new port every epoch) or a fixed port number 1024-65535",
        )),
    }
}

/// `tun_name`: an interface name; the role's default when unset.
pub(super) fn tun_name(
    src: &Source,
    v: Option<&Spanned<String>>,
    default: &str,
) -> Result<String, ConfigError> {
    v.map_or_else(|| Ok(default.to_owned()), |t| interface_name(src, t))
}

/// `control_socket`: where `mt6d status`, `reload` and `peer` reach the daemon; one per TUN
/// name when unset ([`super::default_control_socket`]). Anything but a socket already there is
/// refused, pointing at the key, or at `section` when the default path is taken.
pub(super) fn control_socket<T>(
    src: &Source,
    v: Option<&Spanned<String>>,
    section: &Spanned<T>,
    tun_name: &str,
) -> Result<PathBuf, ConfigError> {
    let path = v.map_or_else(
        || super::default_control_socket(tun_name),
        |p| PathBuf::from(p.get_ref()),
    );
    // The daemon replaces a dead socket at this path; anything else there is someone's
    // file and is refused now rather than deleted at start-up.
    if let Err(why) = crate::daemon::files::refuse_non_socket(&path) {
        return Err(match v {
            Some(p) => src.err(p, why),
            None => src.err(section, why),
        });
    }
    Ok(path)
}

/// `state_dir`: relative to the configuration file's directory unless absolute; never empty.
pub(super) fn state_dir(src: &Source, v: Option<&Spanned<String>>) -> Result<PathBuf, ConfigError> {
    match v {
        Some(d) if d.get_ref().is_empty() => Err(src.err(d, "state_dir is empty")),
        Some(d) => Ok(relative_to(src.path, d.get_ref())),
        None => Ok(PathBuf::from(DEFAULT_STATE_DIR)),
    }
}

/// `log_level`: error, warn, info, debug, trace or off; None when unset (`info`, unless
/// `mt6d run --log-level` or `RUST_LOG` say otherwise).
pub(super) fn log_level(
    src: &Source,
    v: Option<&Spanned<String>>,
) -> Result<Option<log::LevelFilter>, ConfigError> {
    v.map(|l| {
        parse_log_level(l.get_ref()).ok_or_else(|| {
            src.err(
                l,
                format!(
                    "log_level {:?}: one of error, warn, info, debug, trace, off",
                    l.get_ref()
                ),
            )
        })
    })
    .transpose()
}

/// `metrics_listen`: the address and port of the Prometheus endpoint; None (no endpoint) when
/// unset.
pub(super) fn metrics_listen(
    src: &Source,
    v: Option<&Spanned<String>>,
) -> Result<Option<SocketAddr>, ConfigError> {
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

/// `workers`: data-plane threads, 1 to [`MAX_WORKERS`]; None when unset (one per online CPU,
/// [`super::worker_count`]).
pub(super) fn workers(
    src: &Source,
    v: Option<&Spanned<i64>>,
) -> Result<Option<usize>, ConfigError> {
    v.map(|w| {
        usize::try_from(*w.get_ref())
            .ok()
            .filter(|n| (1..=MAX_WORKERS).contains(n))
            .ok_or_else(|| {
                src.err(
                    w,
                    format!("workers: the number of data-plane threads, 1 to {MAX_WORKERS} (unset: one per online CPU)"),
                )
            })
    })
    .transpose()
}

/// `private_key_file`: this node's identity key, relative to the configuration file's
/// directory; None when unset.
pub(super) fn private_key(
    src: &Source,
    v: Option<&Spanned<String>>,
) -> Result<Option<PrivateKey>, ConfigError> {
    v.map(|f| {
        keys::read_private_key(&relative_to(src.path, f.get_ref())).map_err(|e| src.err(f, e))
    })
    .transpose()
}

/// `rekey_secs`: seconds between handshakes (default [`DEFAULT_REKEY_SECS`]).
pub(super) fn rekey_after(src: &Source, v: Option<&Spanned<f64>>) -> Result<Duration, ConfigError> {
    seconds(
        src,
        v,
        "rekey_secs",
        Duration::from_secs(DEFAULT_REKEY_SECS),
    )
}

/// `listen_port`: the transparent sockets' local port (never on the wire), 1-65535.
pub(super) fn listen_port(
    src: &Source,
    v: Option<&Spanned<i64>>,
    default: u16,
) -> Result<u16, ConfigError> {
    v.map_or(Ok(default), |p| {
        u16::try_from(*p.get_ref())
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| src.err(p, "listen_port must be 1-65535"))
    })
}

/// `mtu`: the external path's MTU, 1280-9000 (default [`DEFAULT_MTU`]).
pub(super) fn mtu(src: &Source, v: Option<&Spanned<i64>>) -> Result<u16, ConfigError> {
    v.map_or(Ok(DEFAULT_MTU), |m| {
        u16::try_from(*m.get_ref())
            .ok()
            .filter(|m| (1280..=9000).contains(m))
            .ok_or_else(|| src.err(m, "mtu must be 1280-9000 (the external path's MTU)"))
    })
}

/// `neighbor_discovery`: answer Neighbour Solicitations for the current hashed addresses; on
/// unless set false.
pub(super) fn neighbor_discovery(v: Option<&Spanned<bool>>) -> bool {
    v.is_none_or(|n| *n.get_ref())
}

/// `interface_down_exit_secs`: how long an interface may be down before the daemon exits
/// (more than 0 and at most 86400 s; default [`DEFAULT_INTERFACE_DOWN_EXIT`]).
pub(super) fn interface_down_exit(
    src: &Source,
    v: Option<&Spanned<f64>>,
) -> Result<Duration, ConfigError> {
    let Some(v) = v else {
        return Ok(DEFAULT_INTERFACE_DOWN_EXIT);
    };
    let secs = *v.get_ref();
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        return Err(src.err(
            v,
            "interface_down_exit_secs: seconds, more than 0 and at most 86400",
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::config::{Config, ServerConfig};
    use std::path::Path;

    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn gateway(gateway_keys: &str, peer_keys: &str) -> Result<Config, ConfigError> {
        Config::parse(
            Path::new("/etc/mt6d/gw.toml"),
            &format!(
                "[gateway]\ninternal_interface = \"eth1\"\nexternal_interface = \"eth0\"\n{gateway_keys}\
                 [[peer]]\nname = \"b\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"2001:db8:1::b\"\nkey = \"{KEY}\"\n{peer_keys}"
            ),
        )
    }

    fn server(keys: &str) -> Result<ServerConfig, ConfigError> {
        ServerConfig::parse(
            Path::new("/etc/mt6d/server.toml"),
            &format!(
                "[server]\nexternal_interface = \"eth0\"\nprefix = \"2001:db8:5::/64\"\n\
                 true_address = \"2001:db8:5:1::1\"\npeers_file = \"clients\"\n\
                 client_routes = [\"2001:db8:c0::/44\"]\n{keys}"
            ),
        )
    }

    /// The stream settings are one schema: written in `[gateway]`, in a `[[peer]]` or in
    /// `[server]`, the same keys give the same settings, and the same mistake the same error at
    /// its own line.
    #[test]
    fn every_section_with_stream_settings_reads_them_alike() {
        let keys = "rotation_secs = 2.5\njitter = true\naead = \"chacha20-poly1305\"\nderivation = \"thesis\"\nport = 4500\n";
        let in_gateway = gateway(keys, "").unwrap().peers[0].stream.clone();
        let in_peer = gateway("", keys).unwrap().peers[0].stream.clone();
        let in_server = server(keys).unwrap().stream;
        for s in [&in_gateway, &in_peer] {
            let as_settings = StreamSettings {
                rotation: s.rotation,
                jitter: s.jitter,
                mode: s.mode,
                aead: s.aead,
                derivation: s.derivation,
                ports: s.ports,
            };
            assert_eq!(as_settings, in_server);
        }
        assert_eq!(in_server.rotation, Duration::from_millis(2500));
        assert_eq!(in_server.ports, PortPolicy::Fixed(4500));
        assert!(in_server.jitter);

        // Unset: the one default of each, whichever the section.
        let defaults = server("").unwrap().stream;
        assert_eq!(defaults.rotation, DEFAULT_ROTATION);
        assert_eq!(defaults.jitter, DEFAULT_JITTER);
        assert_eq!(defaults.ports, PortPolicy::Hopping);
        assert_eq!(
            gateway("", "").unwrap().peers[0].stream.rotation,
            DEFAULT_ROTATION
        );

        for (bad, what) in [
            ("port = 80\n", "port must be \"hopping\""),
            (
                "rotation_secs = 0.5\n",
                "rotation_secs 0.5 out of range (1 to 86400)",
            ),
            ("derivation = \"md5\"\n", "md5"),
        ] {
            let g = gateway(bad, "").unwrap_err().to_string();
            let p = gateway("", bad).unwrap_err().to_string();
            let s = server(bad).unwrap_err().to_string();
            assert!(
                g.starts_with("/etc/mt6d/gw.toml:4:") && g.contains(what),
                "{g}"
            );
            assert!(
                p.starts_with("/etc/mt6d/gw.toml:9:") && p.contains(what),
                "{p}"
            );
            assert!(
                s.starts_with("/etc/mt6d/server.toml:7:") && s.contains(what),
                "{s}"
            );
        }
    }

    /// `log_level`, `state_dir`, `mtu`, `workers` and `metrics_listen` read alike in every role:
    /// the server's bad `log_level` names the value as the gateway's does, and its relative
    /// `state_dir` is relative to the file, not to wherever the daemon was started.
    #[test]
    fn node_settings_read_alike_in_every_role() {
        let g = gateway("log_level = \"loud\"\n", "")
            .unwrap_err()
            .to_string();
        let s = server("log_level = \"loud\"\n").unwrap_err().to_string();
        assert!(g.starts_with("/etc/mt6d/gw.toml:4:"), "{g}");
        assert!(s.starts_with("/etc/mt6d/server.toml:7:"), "{s}");
        for e in [&g, &s] {
            assert!(
                e.contains("log_level \"loud\": one of error, warn, info, debug, trace, off"),
                "{e}"
            );
        }
        let s = server("state_dir = \"state\"\nmtu = 9000\n").unwrap();
        assert_eq!(s.state_dir, Path::new("/etc/mt6d/state"));
        assert_eq!(s.mtu, 9000);
        assert_eq!(server("").unwrap().mtu, DEFAULT_MTU);
        let e = server("state_dir = \"\"\n").unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/mt6d/server.toml:7:") && e.contains("state_dir is empty"),
            "{e}"
        );
        let e = server("workers = 0\n").unwrap_err().to_string();
        assert!(
            e.contains("workers: the number of data-plane threads, 1 to 64"),
            "{e}"
        );
        let e = server("metrics_listen = \"::1\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("metrics_listen \"::1\" is not an address and port"),
            "{e}"
        );
    }
}
