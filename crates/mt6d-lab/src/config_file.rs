//! The configuration files the lab writes for its gateways, as typed sections serialised to
//! TOML (the daemon's schema, docs/CONFIG.md), so that every value is quoted and escaped the way
//! the daemon's parser reads it. Only the settings the lab uses are here; `mt6d run` validates
//! the file as it would any other. Paths are given as text (`Path::display`), as the lab always
//! wrote them.

use std::net::Ipv6Addr;

use serde::Serialize;

/// One gateway's file: `[gateway]` and its `[[peer]]`s.
#[derive(Debug, Serialize)]
pub struct ConfigFile {
    pub gateway: GatewaySection,
    #[serde(rename = "peer")]
    pub peers: Vec<PeerSection>,
}

/// `[gateway]`, in the order the lab has always written it.
#[derive(Debug, Serialize)]
pub struct GatewaySection {
    /// `"host"` in host mode; absent (a gateway) otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_interface: Option<String>,
    pub external_interface: String,
    pub tun_name: String,
    pub control_socket: String,
    pub rotation_secs: f64,
    pub mode: String,
    /// `accept_clear_payload = true`: written for `plain` and `auth`, which the daemon refuses
    /// without it (docs/CONFIG.md).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub accept_clear_payload: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_next_hop: Option<Ipv6Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rekey_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// `jitter = true`: key-derived jitter of every peer's epoch boundaries; absent (the
    /// daemon's default, off) otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub jitter: bool,
}

/// One `[[peer]]`: a pre-shared `key_file` or the other gateway's `public_key`.
#[derive(Debug, Serialize)]
pub struct PeerSection {
    pub name: String,
    pub local_host: Ipv6Addr,
    pub remote_host: Ipv6Addr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// `ADDRESS/64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_prefix: Option<String>,
}

impl PeerSection {
    /// Both hashed /64s, where each side has its own (behind a router).
    pub fn with_prefixes(mut self, own: Option<Ipv6Addr>, far: Option<Ipv6Addr>) -> PeerSection {
        if let (Some(lp), Some(rp)) = (own, far) {
            self.local_prefix = Some(format!("{lp}/64"));
            self.remote_prefix = Some(format!("{rp}/64"));
        }
        self
    }
}

impl ConfigFile {
    /// The file's text: `comment` on the first line, then the sections.
    pub fn text(&self, comment: &str) -> String {
        // Every field is a string, an address, a number or a list of tables of those: all
        // have a TOML form, so serialising cannot fail.
        let body = toml::to_string(self).expect("strings, addresses and numbers are TOML");
        format!("# {comment}\n{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::topology::{
        gateway_config_text, ConfigText, GatewaySettings, LabKeys, Public, Side, HOST_A, HOST_B,
    };
    use mt6d::config::{Config, Keying, Role};
    use std::os::unix::fs::DirBuilderExt;

    /// What the lab writes is what the daemon reads: every kind of lab file parses, with the
    /// values the lab meant (a path with a space and a quote included).
    #[test]
    fn the_daemon_reads_what_the_lab_writes() {
        let dir = std::env::temp_dir().join(format!("mt6d-lab \"cfg\" {}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("private dir");
        let a = |s: &str| s.parse().expect("literal");
        let switched = Public {
            addr: a("2001:db8:1::1"),
            prefix: None,
            router: None,
            next_hop: a("2001:db8:1::2"),
        };
        let routed_a = Public {
            prefix: Some(a("2001:db8:a::")),
            router: Some(a("2001:db8:a::1")),
            ..switched
        };
        let routed_b = Public {
            prefix: Some(a("2001:db8:b::")),
            ..routed_a
        };
        let socket = dir.join("ctl.sock");
        for (handshake, rekey) in [(false, None), (true, None), (true, Some(30.0))] {
            let key_dir = dir.join(format!("keys-{handshake}-{rekey:?}"));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&key_dir)
                .expect("key dir");
            let keys = LabKeys::generate(&key_dir, handshake, rekey).expect("keys");
            for (host_mode, own, far) in [
                (false, &switched, &switched),
                (false, &routed_a, &routed_b),
                (true, &switched, &switched),
            ] {
                let settings = GatewaySettings {
                    rotation_secs: 1.5,
                    mode: "encrypt",
                    keys: &keys,
                    workers: None,
                };
                let text = gateway_config_text(&ConfigText {
                    comment: "test",
                    socket: &socket,
                    settings: &settings,
                    side: Side::A,
                    local: HOST_A,
                    remote: HOST_B,
                    own,
                    far,
                    host_mode,
                });
                let cfg = Config::parse(&dir.join("gw.toml"), &text)
                    .unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(cfg.gateway.control_socket, socket);
                // Counters (of any pre-shared peer, even one added later) stay in the lab's
                // directory, never in the system's.
                assert!(
                    cfg.gateway.state_dir.starts_with(&key_dir),
                    "{}",
                    cfg.gateway.state_dir.display()
                );
                assert_eq!(cfg.gateway.external_next_hop, own.router);
                assert_eq!(cfg.gateway.is_host(), host_mode, "{text}");
                if host_mode {
                    assert_eq!(cfg.gateway.role, Role::Host { local_host: HOST_A });
                }
                let peer = &cfg.peers[0];
                assert_eq!(peer.stream.rotation.as_millis(), 1500);
                assert_eq!(peer.stream.local.external_prefix, own.prefix);
                assert_eq!(peer.stream.remote.external_prefix, far.prefix);
                match (&peer.keying, handshake) {
                    (Keying::Handshake(hs), true) => assert_eq!(
                        hs.rekey_after.as_secs(),
                        rekey.map_or(mt6d::config::DEFAULT_REKEY_SECS, |r| r as u64)
                    ),
                    (Keying::PreShared, false) => {}
                    _ => panic!("keying does not match handshake = {handshake}"),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
