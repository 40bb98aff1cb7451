//! The lab: the topology of 000 §3.3 / Fig. 3.9 (switched variant of 000 §4.1) in four network
//! namespaces, built and torn down by the program itself.
//!
//! ```text
//!  Host A            Gateway A                      Gateway B             Host B
//!  eth0 ---------- int0     ext0 ---- public ---- ext0     int0 ---------- eth0
//!  2001:db8:1::a                    link                                  2001:db8:1::b
//! ```
//!
//! The two protected hosts share one /64 as in the thesis: Host A sends to Host B's true address
//! as if B were on its link, and Gateway A answers neighbour discovery for it. The public link
//! carries nothing but hashed addresses (and link-local neighbour discovery).
//!
//! The *baseline* is the same path without MT6D: the gateways forward the hosts' packets with
//! plain kernel IPv6 forwarding (proxy NDP on both sides, on-link routes), so "with and without
//! the tunnel" are measured over the same namespaces, veths and CPU.

use std::net::Ipv6Addr;

use mt6d_os::{sysctl, unique_name, AddrFlags, Netlink, Netns};

/// The protected hosts' true addresses in the lab.
pub const HOST_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xa);
pub const HOST_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xb);
/// The gateways' own management addresses on their protected (internal) links.
pub const GATEWAY_A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa, 0, 0, 0, 0, 0, 1);
pub const GATEWAY_B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xb, 0, 0, 0, 0, 0, 1);

pub const INTERNAL_IF: &str = "int0";
pub const EXTERNAL_IF: &str = "ext0";
const HOST_IF: &str = "eth0";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    #[error("lab: {what}: {source}")]
    Os {
        what: String,
        #[source]
        source: mt6d_os::OsError,
    },
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> LabError {
    let what = what.into();
    move |source| LabError::Os { what, source }
}

/// Which gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// The four namespaces. Dropping the lab deletes them, and with them every interface inside.
#[derive(Debug)]
pub struct Lab {
    pub host_a: Netns,
    pub gw_a: Netns,
    pub gw_b: Netns,
    pub host_b: Netns,
}

impl Lab {
    /// Builds the topology with fresh, uniquely named namespaces.
    pub fn build() -> Result<Lab, LabError> {
        let ns = |p: &str| {
            let name = unique_name(p);
            Netns::create(&name).map_err(os(format!("create namespace {name}")))
        };
        let lab = Lab {
            host_a: ns("m6ha")?,
            gw_a: ns("m6ga")?,
            gw_b: ns("m6gb")?,
            host_b: ns("m6hb")?,
        };
        for n in [&lab.host_a, &lab.gw_a, &lab.gw_b, &lab.host_b] {
            in_ns(n, |_| {
                // No DAD in the lab: addresses are unique by construction, and waiting a second
                // for DAD on every link-local would only slow the demo down.
                for iface in ["all", "default"] {
                    sysctl::set_ipv6_conf(iface, "accept_dad", "0")?;
                }
                let mut nl = Netlink::open()?;
                let lo = nl.link_index("lo")?;
                nl.link_set_up(lo)
            })?;
        }
        lab.veth(&lab.gw_a, INTERNAL_IF, &lab.host_a, HOST_IF)?;
        lab.veth(&lab.gw_a, EXTERNAL_IF, &lab.gw_b, EXTERNAL_IF)?;
        lab.veth(&lab.gw_b, INTERNAL_IF, &lab.host_b, HOST_IF)?;

        for (n, addr) in [(&lab.host_a, HOST_A), (&lab.host_b, HOST_B)] {
            in_ns(n, |nl| {
                let i = nl.link_index(HOST_IF)?;
                nl.add_address(
                    i,
                    addr,
                    64,
                    AddrFlags {
                        nodad: true,
                        noprefixroute: false,
                    },
                )
            })?;
        }
        for (n, addr) in [(&lab.gw_a, GATEWAY_A), (&lab.gw_b, GATEWAY_B)] {
            in_ns(n, |nl| {
                let i = nl.link_index(INTERNAL_IF)?;
                nl.add_address(
                    i,
                    addr,
                    64,
                    AddrFlags {
                        nodad: true,
                        noprefixroute: false,
                    },
                )
            })?;
        }
        Ok(lab)
    }

    /// A veth pair between two namespaces, both ends up.
    fn veth(&self, a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> Result<(), LabError> {
        // Created in `a` under a temporary peer name, moved to `b`, renamed there.
        let tmp = unique_name("m6v");
        let b_fd = b.fd();
        in_ns(a, |nl| {
            nl.create_veth(a_name, &tmp)?;
            let peer = nl.link_index(&tmp)?;
            nl.move_link_to_netns(peer, b_fd)?;
            let own = nl.link_index(a_name)?;
            nl.link_set_up(own)
        })?;
        in_ns(b, |nl| {
            let peer = nl.link_index(&tmp)?;
            nl.link_rename(peer, b_name)?;
            nl.link_set_up(peer)
        })
    }

    pub fn gateway(&self, side: Side) -> &Netns {
        match side {
            Side::A => &self.gw_a,
            Side::B => &self.gw_b,
        }
    }

    /// Plain forwarding between the hosts through both gateways, no MT6D: the baseline.
    pub fn baseline_up(&self) -> Result<(), LabError> {
        self.baseline(true)
    }

    /// Removes the baseline forwarding state before the MT6D gateways start.
    pub fn baseline_down(&self) -> Result<(), LabError> {
        self.baseline(false)
    }

    fn baseline(&self, up: bool) -> Result<(), LabError> {
        for (gw, local, remote) in [(&self.gw_a, HOST_A, HOST_B), (&self.gw_b, HOST_B, HOST_A)] {
            in_ns(gw, |nl| {
                let int = nl.link_index(INTERNAL_IF)?;
                let ext = nl.link_index(EXTERNAL_IF)?;
                if up {
                    sysctl::set_ipv6_conf("all", "forwarding", "1")?;
                    for i in [INTERNAL_IF, EXTERNAL_IF] {
                        sysctl::set_ipv6_conf(i, "proxy_ndp", "1")?;
                    }
                    nl.add_route(local, 128, int)?;
                    nl.add_route(remote, 128, ext)?;
                    nl.add_proxy_neighbor(int, remote)?;
                    nl.add_proxy_neighbor(ext, local)?;
                } else {
                    nl.del_proxy_neighbor(ext, local)?;
                    nl.del_proxy_neighbor(int, remote)?;
                    nl.del_route(remote, 128, ext)?;
                    nl.del_route(local, 128, int)?;
                    sysctl::set_ipv6_conf(EXTERNAL_IF, "proxy_ndp", "0")?;
                    sysctl::set_ipv6_conf("all", "forwarding", "0")?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// The configuration file of one gateway of the lab.
    pub fn gateway_config(&self, side: Side, settings: &GatewaySettings<'_>) -> String {
        let (local, remote, name) = match side {
            Side::A => (HOST_A, HOST_B, "site-b"),
            Side::B => (HOST_B, HOST_A, "site-a"),
        };
        let (gateway_keys, peer_keys) = settings.keys.config_lines(side);
        format!(
            "# Generated by `mt6d demo` for the lab gateway {side:?} (namespace {ns}).\n\
[gateway]\n\
internal_interface = \"{INTERNAL_IF}\"\n\
external_interface = \"{EXTERNAL_IF}\"\n\
tun_name = \"mt6d0\"\n\
control_socket = \"{socket}\"\n\
rotation_secs = {rotation}\n\
mode = \"{mode}\"\n\
{gateway_keys}\
\n\
[[peer]]\n\
name = \"{name}\"\n\
local_host = \"{local}\"\n\
remote_host = \"{remote}\"\n\
{peer_keys}",
            ns = self.gateway(side).name(),
            socket = self.control_socket(side).display(),
            rotation = settings.rotation_secs,
            mode = settings.mode,
        )
    }

    /// Where each lab gateway's control socket lives.
    pub fn control_socket(&self, side: Side) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/run/mt6d/{}.sock", self.gateway(side).name()))
    }
}

/// The knobs the demo passes to both lab gateways.
#[derive(Debug)]
pub struct GatewaySettings<'a> {
    pub rotation_secs: f64,
    pub mode: &'a str,
    pub keys: &'a LabKeys,
}

/// The lab gateways' keys, written into a private directory with mode 0600.
#[derive(Debug, Clone)]
pub enum LabKeys {
    /// Each gateway has an identity key and knows the other's public key (the default).
    Handshake {
        private_a: std::path::PathBuf,
        private_b: std::path::PathBuf,
        public_a: String,
        public_b: String,
        rekey_secs: Option<f64>,
    },
    /// One pre-shared session key for both (thesis compatibility; `plain` needs it).
    PreShared { key_file: std::path::PathBuf },
}

impl LabKeys {
    /// New keys in `dir` (which must exist and be private).
    pub fn generate(
        dir: &std::path::Path,
        handshake: bool,
        rekey_secs: Option<f64>,
    ) -> Result<LabKeys, crate::keys::KeyError> {
        use crate::keys;
        if !handshake {
            let key_file = dir.join("session.key");
            keys::write_secret_file(&key_file, &keys::encode(keys::random32()?.as_slice()))?;
            return Ok(LabKeys::PreShared { key_file });
        }
        let make = |label: &str| -> Result<(std::path::PathBuf, String), keys::KeyError> {
            let private = keys::new_private_key()?;
            let path = dir.join(format!("gateway-{label}.key"));
            keys::write_secret_file(&path, &keys::encode(private.to_bytes().as_slice()))?;
            Ok((path, keys::public_key_text(&private.public_key())))
        };
        let (private_a, public_a) = make("a")?;
        let (private_b, public_b) = make("b")?;
        Ok(LabKeys::Handshake {
            private_a,
            private_b,
            public_a,
            public_b,
            rekey_secs,
        })
    }

    /// Whether the gateways run handshakes.
    pub fn is_handshake(&self) -> bool {
        matches!(self, LabKeys::Handshake { .. })
    }

    /// (lines for `[gateway]`, lines for `[[peer]]`) of `side`'s configuration.
    fn config_lines(&self, side: Side) -> (String, String) {
        match self {
            LabKeys::PreShared { key_file } => (
                String::new(),
                format!("key_file = \"{}\"\n", key_file.display()),
            ),
            LabKeys::Handshake {
                private_a,
                private_b,
                public_a,
                public_b,
                rekey_secs,
            } => {
                let (own, peer) = match side {
                    Side::A => (private_a, public_b),
                    Side::B => (private_b, public_a),
                };
                let rekey = rekey_secs.map_or(String::new(), |r| format!("rekey_secs = {r}\n"));
                (
                    format!("private_key_file = \"{}\"\n{rekey}", own.display()),
                    format!("public_key = \"{peer}\"\n"),
                )
            }
        }
    }
}

/// Runs `f` with a netlink socket inside namespace `n`.
pub fn in_ns<T: Send>(
    n: &Netns,
    f: impl FnOnce(&mut Netlink) -> Result<T, mt6d_os::OsError> + Send,
) -> Result<T, LabError> {
    n.run(|| {
        let mut nl = Netlink::open()?;
        f(&mut nl)
    })
    .map_err(os(format!("enter namespace {}", n.name())))?
    .map_err(os(format!("in namespace {}", n.name())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The baseline path works and the lab leaves no namespace behind.
    #[test]
    fn baseline_forwards_and_lab_cleans_up() {
        if !super::super::is_root() {
            eprintln!("skipped: needs root for network namespaces");
            return;
        }
        let lab = Lab::build().expect("lab builds");
        let names: Vec<String> = [&lab.host_a, &lab.gw_a, &lab.gw_b, &lab.host_b]
            .iter()
            .map(|n| n.name().to_string())
            .collect();
        lab.baseline_up().expect("baseline up");
        let report = lab
            .host_a
            .run(|| {
                super::super::ping::ping(
                    HOST_B,
                    5,
                    super::super::ping::Pace::Flood {
                        wait: std::time::Duration::from_millis(500),
                    },
                    std::time::Duration::from_millis(500),
                )
            })
            .expect("enter host A")
            .expect("ping runs");
        assert_eq!(report.received, 5, "{report:?}");
        lab.baseline_down().expect("baseline down");
        drop(lab);
        for n in names {
            assert!(
                !std::path::Path::new("/run/netns").join(&n).exists(),
                "{n} left behind"
            );
        }
    }
}
