//! `[gateway]`: each setting checked in turn, before the peers are read.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d_proto::handshake::PrivateKey;
use toml::Spanned;

use super::raw::{interface_name, RawGateway, Source};
use super::settings;
use super::{ConfigError, GatewayConfig, Role, CHACHA_REKEY_PACKETS, DEFAULT_GATEWAY_TUN};

/// The `[gateway]` section validated, before the peers say which address a host protects.
pub(super) struct GatewaySection {
    pub(super) host_role: bool,
    /// None in host mode.
    pub(super) internal_interface: Option<String>,
    pub(super) external_interface: String,
    pub(super) tun_name: String,
    pub(super) router_advertisements: bool,
    pub(super) log_level: Option<log::LevelFilter>,
    pub(super) interface_down_exit: Duration,
    pub(super) control_socket: PathBuf,
    pub(super) external_next_hop: Option<Ipv6Addr>,
    /// What every peer with a `public_key` uses for its handshake.
    pub(super) private_key: Option<PrivateKey>,
    pub(super) rekey_after: Duration,
    pub(super) rekey_packets: Option<u64>,
    pub(super) state_dir: PathBuf,
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    pub(super) workers: Option<usize>,
}

impl GatewaySection {
    /// Each setting in the order of the checks, so that of several mistakes the same one is
    /// reported first.
    pub(super) fn parse(
        src: &Source,
        section: &Spanned<RawGateway>,
    ) -> Result<GatewaySection, ConfigError> {
        let gw = section.get_ref();
        let host_role = host_role(src, gw)?;
        let (internal_interface, external_interface, tun_name) =
            interfaces(src, section, host_role)?;
        let router_advertisements = router_advertisements(src, gw, host_role)?;
        let log_level = settings::log_level(src, gw.log_level.as_ref())?;
        let interface_down_exit =
            settings::interface_down_exit(src, gw.interface_down_exit_secs.as_ref())?;
        let control_socket =
            settings::control_socket(src, gw.control_socket.as_ref(), section, &tun_name)?;
        let external_next_hop =
            match &gw.external_next_hop {
                None => None,
                Some(v) => Some(v.get_ref().parse::<Ipv6Addr>().map_err(|_| {
                    src.err(v, format!("{:?} is not an IPv6 address", v.get_ref()))
                })?),
            };
        let private_key = settings::private_key(src, gw.private_key_file.as_ref())?;
        let rekey_after = settings::rekey_after(src, gw.rekey_secs.as_ref())?;
        let rekey_packets = match &gw.rekey_packets {
            None => None,
            Some(v) => Some(
                u64::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (1000..=CHACHA_REKEY_PACKETS).contains(n))
                    .ok_or_else(|| src.err(v, "rekey_packets out of range (1000 to 2^36)"))?,
            ),
        };
        let state_dir = settings::state_dir(src, gw.state_dir.as_ref())?;
        let metrics_listen = settings::metrics_listen(src, gw.metrics_listen.as_ref())?;
        let workers = settings::workers(src, gw.workers.as_ref())?;
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
            metrics_listen,
            workers,
        })
    }

    /// The gateway's settings, once the peers named the host's address (host mode).
    pub(super) fn finish(
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
            metrics_listen: self.metrics_listen,
            workers: self.workers,
            tcp: super::TcpConfig::default(),
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
    let tun_name = settings::tun_name(src, gw.tun_name.as_ref(), DEFAULT_GATEWAY_TUN)?;
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
