//! The lab of the server role (seed 002): a router that routes the server's hashed /64
//! to the server and each client namespace's hashed /64 to that namespace.
//!
//! ```text
//!  c1 (2001:db8:c1::/64 hashed, 2001:db8:c1:1::/64 true) --r1-\
//!                                                             router --rs-- server
//!  c2 (2001:db8:c2::/64 hashed, 2001:db8:c2:1::/64 true) --r2-/     (2001:db8:5::/64 hashed,
//!                                                                    2001:db8:5:1::1 true)
//! ```
//!
//! The namespaces are deleted when the lab is dropped. Used by the server's netns test and by
//! `mt6d bench --server`.

use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_os::{unique_name, Netns};
use mt6d_proto::Mode;

use super::clients::ClientSpec;
use super::topology::{dad_settled, ip, resolved, veth, LabError};

/// The server's protected address (on its TUN device).
pub const SERVER_TRUE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 1, 0, 0, 0, 1);
/// The server's hashed /64.
pub const SERVER_PREFIX: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 0);
/// The server's external interface.
pub const SERVER_IF: &str = "s0";
/// The echo service's port (002's).
pub const ECHO_PORT: u16 = 3540;

/// The namespaces.
#[derive(Debug)]
pub struct ServerLab {
    pub router: Netns,
    pub server: Netns,
    pub clients: [Netns; 2],
}

impl ServerLab {
    /// Builds the lab with namespace names starting with `prefix`; the router routes the
    /// server's prefix to the server's link address.
    pub fn build(prefix: &str) -> Result<ServerLab, LabError> {
        ServerLab::build_with(prefix, false)
    }

    /// [`ServerLab::build`], or with `on_link` the server's prefix on-link on the router's
    /// segment with the server: the router resolves every hashed address with a Neighbour
    /// Solicitation, which only the server's responder can answer (a segment shared with the
    /// server).
    pub fn build_with(prefix: &str, on_link: bool) -> Result<ServerLab, LabError> {
        let ns = |tag: &str| {
            Netns::create(&unique_name(&format!("{prefix}{tag}")))
                .map_err(|e| LabError::Command(format!("create a namespace: {e}")))
        };
        let lab = ServerLab {
            router: ns("r")?,
            server: ns("s")?,
            clients: [ns("a")?, ns("b")?],
        };
        // `lo` up in the server's namespace: its metrics endpoint listens on [::1].
        ip(&lab.server, &["link", "set", "lo", "up"])?;
        veth(&lab.router, "rs", &lab.server, SERVER_IF)?;
        veth(&lab.router, "r1", &lab.clients[0], "c0")?;
        veth(&lab.router, "r2", &lab.clients[1], "c0")?;
        for (n, dev, addr) in [
            (&lab.router, "rs", "2001:db8:f5::1/64"),
            (&lab.router, "r1", "2001:db8:f1::1/64"),
            (&lab.router, "r2", "2001:db8:f2::1/64"),
            (&lab.server, SERVER_IF, "2001:db8:f5::2/64"),
            (&lab.clients[0], "c0", "2001:db8:f1::2/64"),
            (&lab.clients[1], "c0", "2001:db8:f2::2/64"),
        ] {
            ip(n, &["-6", "addr", "add", addr, "dev", dev, "nodad"])?;
        }
        lab.router
            .run(|| {
                mt6d_os::sysctl::set_ipv6_conf("all", "forwarding", "1")
                    .map_err(|e| LabError::Command(format!("forwarding on the router: {e}")))
            })
            .map_err(|e| LabError::Command(e.to_string()))??;
        if on_link {
            ip(
                &lab.router,
                &["-6", "route", "add", "2001:db8:5::/64", "dev", "rs"],
            )?;
        } else {
            ip(
                &lab.router,
                &[
                    "-6",
                    "route",
                    "add",
                    "2001:db8:5::/64",
                    "via",
                    "2001:db8:f5::2",
                ],
            )?;
        }
        for (dst, via) in [
            ("2001:db8:c1::/64", "2001:db8:f1::2"),
            ("2001:db8:c2::/64", "2001:db8:f2::2"),
        ] {
            ip(&lab.router, &["-6", "route", "add", dst, "via", via])?;
        }
        for (n, via) in [
            (&lab.server, "2001:db8:f5::1"),
            (&lab.clients[0], "2001:db8:f1::1"),
            (&lab.clients[1], "2001:db8:f2::1"),
        ] {
            ip(n, &["-6", "route", "add", "default", "via", via])?;
        }
        // Neighbours resolved before traffic, as on a network that has been up a while: the
        // first datagrams would otherwise wait in (and overflow) the neighbour queue while the
        // first solicitation of a link that just came up goes unanswered.
        for (n, dev, peer) in [
            (&lab.server, SERVER_IF, "2001:db8:f5::1"),
            (&lab.clients[0], "c0", "2001:db8:f1::1"),
            (&lab.clients[1], "c0", "2001:db8:f2::1"),
            (&lab.router, "rs", "2001:db8:f5::2"),
            (&lab.router, "r1", "2001:db8:f1::2"),
            (&lab.router, "r2", "2001:db8:f2::2"),
        ] {
            let addr = peer.parse().map_err(|_| LabError::Command(peer.into()))?;
            if resolved(n, dev, addr, Duration::from_secs(5))?.is_none() {
                return Err(LabError::Command(format!(
                    "{peer} on {dev} in {} not resolved within 5 s",
                    n.name()
                )));
            }
        }
        // Duplicate address detection over: a router whose link-local address is still
        // tentative sends no solicitation (docs/ARCHITECTURE.md "The server role").
        for n in [&lab.router, &lab.server, &lab.clients[0], &lab.clients[1]] {
            dad_settled(n, Duration::from_secs(5))?;
        }
        Ok(lab)
    }

    /// The clients of namespace `n` (1 or 2): hashed in 2001:db8:cN::/64, true addresses in
    /// 2001:db8:cN:1::/64.
    pub fn spec(n: u16, rotation: Duration, jitter: bool) -> ClientSpec {
        ClientSpec {
            server_true: SERVER_TRUE,
            server_prefix: SERVER_PREFIX,
            client_prefix: Ipv6Addr::new(0x2001, 0xdb8, 0xc0 + n, 0, 0, 0, 0, 0),
            true_base: Ipv6Addr::new(0x2001, 0xdb8, 0xc0 + n, 1, 0, 0, 0, 0),
            rotation,
            jitter,
            mode: Mode::Encrypt,
            key_salt: n as u8,
        }
    }

    /// The server's configuration (routed: the router routes the prefix to it, so no
    /// neighbour responder), its peers file `clients` beside it.
    pub fn server_config(
        rotation_secs: f64,
        workers: usize,
        state_dir: &std::path::Path,
    ) -> String {
        Self::server_config_with(rotation_secs, workers, state_dir, false)
    }

    /// [`ServerLab::server_config`], with the neighbour responder on or off.
    pub fn server_config_with(
        rotation_secs: f64,
        workers: usize,
        state_dir: &std::path::Path,
        neighbor_discovery: bool,
    ) -> String {
        format!(
            "[server]\nexternal_interface = \"{SERVER_IF}\"\nprefix = \"{SERVER_PREFIX}/64\"\n\
             true_address = \"{SERVER_TRUE}\"\npeers_file = \"clients\"\n\
             client_routes = [\"2001:db8:c1:1::/64\", \"2001:db8:c2:1::/64\"]\n\
             neighbor_discovery = {neighbor_discovery}\nrotation_secs = {rotation_secs}\n\
             jitter = true\nworkers = {workers}\nstate_dir = \"{}\"\n",
            state_dir.display()
        )
    }
}
