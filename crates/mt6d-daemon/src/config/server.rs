//! `[server]`: the server role (seed 002; docs/CONFIG.md "The server role"). One daemon
//! serves every client listed in a peers file, each on hashed addresses of its own, from one
//! AnyIP /64: nothing per client in the kernel.
//!
//! Validated here, before the daemon touches the OS, as the gateway's file is: every error names
//! the file, line and column (or the peers file's line and field).

use std::collections::HashSet;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d_proto::handshake::{link_key_with_public, PrivateKey, Psk, PublicKey};
use mt6d_proto::peers_file::{self, PeerEntry};
use mt6d_proto::{Endpoint, Mode, SessionKey, StreamConfig};
use serde::Deserialize;
use toml::Spanned;

use super::raw::{address, interface_name, prefix64, relative_to, with_stream_keys, Source};
use super::settings::{self, StreamSettings, DEFAULT_JITTER};
use super::{rekey_packets_limit, ConfigError};
use crate::keys;

/// Default TUN device of the server role.
pub const DEFAULT_SERVER_TUN: &str = "mt6ds0";
/// Default port the tproxy rule hands the prefix's datagrams to (never seen on the wire: the
/// datagrams keep their own destination; it is the transparent sockets' local port).
pub const DEFAULT_LISTEN_PORT: u16 = 7410;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerFile {
    server: Spanned<RawServer>,
}

with_stream_keys! {
    pub(super) struct RawServer {
        external_interface: Spanned<String>,
        prefix: Spanned<String>,
        true_address: Spanned<String>,
        peers_file: Spanned<String>,
        client_routes: Spanned<Vec<Spanned<String>>>,
        tun_name: Option<Spanned<String>>,
        listen_port: Option<Spanned<i64>>,
        neighbor_discovery: Option<Spanned<bool>>,
        state_dir: Option<Spanned<String>>,
        workers: Option<Spanned<i64>>,
        log_level: Option<Spanned<String>>,
        mtu: Option<Spanned<i64>>,
        private_key_file: Option<Spanned<String>>,
        rekey_secs: Option<Spanned<f64>>,
        control_socket: Option<Spanned<String>>,
        metrics_listen: Option<Spanned<String>>,
        external_next_hop: Option<Spanned<String>>,
    }
}

/// The validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub path: PathBuf,
    pub external_interface: String,
    /// The server's hashed /64 (high 64 bits), local as a whole through one AnyIP route.
    pub prefix: Ipv6Addr,
    /// The server's protected address: on the TUN device; the services clients reach listen on it.
    pub true_address: Ipv6Addr,
    pub peers_file: PathBuf,
    /// Prefixes holding the clients' true addresses, routed into the TUN device.
    pub client_routes: Vec<(Ipv6Addr, u8)>,
    pub tun_name: String,
    /// The transparent sockets' port (tproxy target).
    pub listen_port: u16,
    /// Answer Neighbour Solicitations on the external link for current hashed addresses (a
    /// server sharing a segment with its router). Off where the router routes the prefix to it.
    pub neighbor_discovery: bool,
    /// The clients' streams' settings (every client the same); never `plain`.
    pub stream: StreamSettings,
    pub state_dir: PathBuf,
    pub workers: Option<usize>,
    pub log_level: Option<log::LevelFilter>,
    /// MTU of the external path; the TUN device gets it minus the tunnel overhead.
    pub mtu: u16,
    /// The server's identity key (`private_key_file`): needed by clients that handshake (a
    /// peers-file line without `key=`).
    pub private_key: Option<PrivateKey>,
    /// The handshake clients' rekey interval as the server counts it: their keys expire after
    /// three of these with no rekey (docs/PROTOCOL.md §9.3). The server never initiates.
    pub rekey_after: Duration,
    /// `mt6d status`, `reload` and `peer` reach the server here.
    pub control_socket: PathBuf,
    /// `metrics_listen`: address and port of the Prometheus endpoint (`GET /metrics`); off
    /// when unset.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The router on the shared segment, primed with each client's next server address
    /// shortly before the client uses it (docs/PROTOCOL.md §5.1); None: no priming.
    pub external_next_hop: Option<Ipv6Addr>,
}

/// One client, validated: its stream settings built from the server's and its peers-file line.
/// A handshake client's stream is keyed by its link key (docs/PROTOCOL.md §9.1): the routes of
/// its link set.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub name: String,
    pub stream: StreamConfig,
    pub line: usize,
    /// None: a pre-shared session key (`key=`), no handshakes.
    pub handshake: Option<ClientHandshake>,
}

/// What the server needs, besides its own identity key, to answer a client's handshakes.
#[derive(Debug, Clone)]
pub struct ClientHandshake {
    pub public_key: PublicKey,
    pub psk: Psk,
}

impl ServerConfig {
    /// Whether `text` is a server role file (a `[server]` table) rather than a gateway's.
    pub fn is_server_file(text: &str) -> bool {
        text.parse::<toml::Table>()
            .is_ok_and(|t| t.contains_key("server"))
    }

    /// Reads and validates a server configuration (not its peers file: [`ServerConfig::clients`]).
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        ServerConfig::parse(path, &super::source::read(path)?)
    }

    /// Validates configuration text (`path` names the file and anchors relative paths).
    pub fn parse(path: &Path, text: &str) -> Result<ServerConfig, ConfigError> {
        let src = Source { path, text };
        let raw: RawServerFile = src.parse_toml()?;
        let s = raw.server.get_ref();
        let external_interface = interface_name(&src, &s.external_interface)?;
        let (prefix, true_address) = prefix_and_true_address(&src, s)?;
        let client_routes = client_routes(&src, s, prefix, true_address)?;
        let tun_name = settings::tun_name(&src, s.tun_name.as_ref(), DEFAULT_SERVER_TUN)?;
        let listen_port = settings::listen_port(&src, s.listen_port.as_ref(), DEFAULT_LISTEN_PORT)?;
        let stream = stream_settings(&src, s)?;
        let workers = settings::workers(&src, s.workers.as_ref())?;
        let log_level = settings::log_level(&src, s.log_level.as_ref())?;
        let private_key = settings::private_key(&src, s.private_key_file.as_ref())?;
        let rekey_after = settings::rekey_after(&src, s.rekey_secs.as_ref())?;
        let neighbor_discovery = settings::neighbor_discovery(s.neighbor_discovery.as_ref());
        let external_next_hop = external_next_hop(&src, s, prefix, neighbor_discovery)?;
        let metrics_listen = settings::metrics_listen(&src, s.metrics_listen.as_ref())?;
        let control_socket =
            settings::control_socket(&src, s.control_socket.as_ref(), &raw.server, &tun_name)?;
        Ok(ServerConfig {
            path: path.to_path_buf(),
            external_interface,
            prefix,
            true_address,
            peers_file: relative_to(path, s.peers_file.get_ref()),
            client_routes,
            tun_name,
            listen_port,
            neighbor_discovery,
            stream,
            state_dir: settings::state_dir(&src, s.state_dir.as_ref())?,
            workers,
            log_level,
            mtu: settings::mtu(&src, s.mtu.as_ref())?,
            private_key,
            rekey_after,
            control_socket,
            metrics_listen,
            external_next_hop,
        })
    }

    /// The handshake settings of `client` (None for a pre-shared key, or without the server's
    /// identity key, which [`ServerConfig::clients`] refuses).
    pub fn handshake_config(
        &self,
        client: &ClientHandshake,
        remote_true: Ipv6Addr,
    ) -> Option<mt6d_proto::handshake::HandshakeConfig> {
        Some(mt6d_proto::handshake::HandshakeConfig {
            local_private: self.private_key.clone()?,
            remote_public: client.public_key,
            psk: client.psk.clone(),
            mode: self.stream.mode,
            aead: self.stream.aead,
            local_true: self.true_address,
            remote_true,
            rekey_after: self.rekey_after,
            rekey_after_packets: rekey_packets_limit(self.stream.aead),
        })
    }

    /// The number of data-plane workers: `workers`, or one per online CPU.
    pub fn worker_count(&self) -> usize {
        super::worker_count(self.workers)
    }

    /// Reads and validates the peers file: mode 0600 (it holds keys), every line parsed, every
    /// client's stream valid. Errors name the file and line.
    pub fn clients(&self) -> Result<Vec<ClientConfig>, ConfigError> {
        let path = &self.peers_file;
        let read_err = |source| ConfigError::Read {
            path: path.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(ConfigError::File {
                path: path.clone(),
                message: format!(
                    "holds keys but group or others can read it (mode {mode:03o}); run: chmod 600 {}",
                    path.display()
                ),
            });
        }
        let bytes = std::fs::read(path).map_err(read_err)?;
        let entries = peers_file::parse_bytes(&bytes).map_err(|e| ConfigError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        self.clients_from(&entries)
    }

    /// [`ServerConfig::clients`] for entries already parsed.
    pub fn clients_from(&self, entries: &[PeerEntry]) -> Result<Vec<ClientConfig>, ConfigError> {
        let mut keys_seen: HashSet<&[u8]> = HashSet::with_capacity(entries.len());
        let own_public = self.private_key.as_ref().map(PrivateKey::public_key);
        for e in entries {
            self.check_client(e, &mut keys_seen, own_public.as_ref())?;
        }
        let links = self.link_keys(entries)?;
        entries
            .iter()
            .zip(links)
            .map(|(e, link)| self.client(e, link))
            .collect()
    }

    /// An error on `line` of the peers file.
    fn line_error(&self, line: usize, message: String) -> ConfigError {
        ConfigError::File {
            path: self.peers_file.clone(),
            message: format!("line {line}: {message}"),
        }
    }

    /// One peers-file entry against the server's settings and the entries before it: its own
    /// session key or a handshake the server can answer, an address of its own, routed into
    /// the tunnel.
    fn check_client<'e>(
        &self,
        e: &'e PeerEntry,
        keys_seen: &mut HashSet<&'e [u8]>,
        own_public: Option<&PublicKey>,
    ) -> Result<(), ConfigError> {
        match &e.session_key {
            Some(key) => {
                // A session key serves one client: the server's true address is in every
                // stream.
                if !keys_seen.insert(key.as_bytes()) {
                    return Err(self.line_error(
                        e.line,
                        format!("client {:?} uses a session key another client already uses; every client needs its own", e.name),
                    ));
                }
            }
            None => {
                if self.private_key.is_none() {
                    return Err(self.line_error(
                        e.line,
                        format!("client {:?} has no key=, so it handshakes, which needs the server's identity key: set [server] private_key_file (create one with `mt6d keygen PATH`), or give the client a pre-shared key=", e.name),
                    ));
                }
                if own_public.is_some_and(|k| *k == e.public_key) {
                    return Err(self.line_error(
                        e.line,
                        format!("client {:?} has the server's own public key", e.name),
                    ));
                }
            }
        }
        if e.true_addr == self.true_address
            || same64(e.true_addr, self.prefix)
            || e.prefix.is_some_and(|p| same64(p, self.prefix))
        {
            return Err(self.line_error(
                e.line,
                format!(
                    "client {:?}: its true address or prefix is the server's own",
                    e.name
                ),
            ));
        }
        if !self
            .client_routes
            .iter()
            .any(|&(p, len)| covers(p, len, e.true_addr))
        {
            return Err(self.line_error(
                e.line,
                format!("client {:?}: {} is in none of client_routes, so its answers would not reach the tunnel", e.name, e.true_addr),
            ));
        }
        Ok(())
    }

    /// A checked entry's client: its stream keyed by its session key or by `link`, the link
    /// key of its handshakes.
    fn client(&self, e: &PeerEntry, link: Option<SessionKey>) -> Result<ClientConfig, ConfigError> {
        let (key, handshake) = match (&e.session_key, link) {
            (Some(key), _) => (key.clone(), None),
            (None, Some(link)) => (
                link,
                Some(ClientHandshake {
                    public_key: e.public_key,
                    psk: e.psk.clone().unwrap_or_else(Psk::none),
                }),
            ),
            // link_keys gives every entry without key= a link key, or fails.
            (None, None) => {
                return Err(self.line_error(
                    e.line,
                    format!("client {:?}: no link key was computed", e.name),
                ))
            }
        };
        let local = Endpoint {
            true_addr: self.true_address,
            external_prefix: Some(self.prefix),
            mac: None,
        };
        let remote = Endpoint {
            true_addr: e.true_addr,
            external_prefix: e.prefix,
            mac: None,
        };
        Ok(ClientConfig {
            name: e.name.clone(),
            stream: self.stream.stream(local, remote, key),
            line: e.line,
            handshake,
        })
    }

    /// The link key (docs/PROTOCOL.md §9.1) of every entry without `key=`, None for the others:
    /// one X25519 each (about 38 us here, the server's own public key computed once), spread over
    /// the CPUs, since a million clients would take over half a minute on one. An error names the
    /// first line at fault.
    fn link_keys(&self, entries: &[PeerEntry]) -> Result<Vec<Option<SessionKey>>, ConfigError> {
        let Some(private) = &self.private_key else {
            return Ok(vec![None; entries.len()]);
        };
        // Computed once: each client then costs one X25519.
        let public = private.public_key();
        let public = &public;
        let results = keys::par_map(entries, |e| -> Result<Option<SessionKey>, LineError> {
            if e.session_key.is_some() {
                return Ok(None);
            }
            let psk = e.psk.clone().unwrap_or_else(Psk::none);
            link_key_with_public(
                private,
                public,
                &e.public_key,
                &psk,
                (self.true_address, e.true_addr),
            )
            .map(Some)
            .map_err(|err| (e.line, format!("client {:?}: {err}", e.name)))
        });
        // The first line at fault, in file order.
        results
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|(line, message)| self.line_error(line, message))
    }
}

/// `prefix` (the hashed /64) and `true_address` (outside it).
fn prefix_and_true_address(
    src: &Source,
    s: &RawServer,
) -> Result<(Ipv6Addr, Ipv6Addr), ConfigError> {
    let prefix = prefix64(src, &s.prefix)?;
    let true_address = address(src, &s.true_address)?;
    if same64(true_address, prefix) {
        return Err(src.err(
            &s.true_address,
            format!("the true address {true_address} is inside the hashed prefix {prefix}/64: the whole /64 is answered as hashed addresses, so the protected address needs another one"),
        ));
    }
    Ok((prefix, true_address))
}

/// `client_routes`: at least one prefix, none covering the server's own prefix or address.
fn client_routes(
    src: &Source,
    s: &RawServer,
    prefix: Ipv6Addr,
    true_address: Ipv6Addr,
) -> Result<Vec<(Ipv6Addr, u8)>, ConfigError> {
    let client_routes = s
        .client_routes
        .get_ref()
        .iter()
        .map(|r| route(src, r))
        .collect::<Result<Vec<_>, _>>()?;
    if client_routes.is_empty() {
        return Err(src.err(
            &s.client_routes,
            "client_routes is empty: give the prefixes holding the clients' true addresses (routed into the TUN device)",
        ));
    }
    for &(p, len) in &client_routes {
        if covers(p, len, prefix) || covers(p, len, true_address) {
            return Err(src.err(
                &s.client_routes,
                format!("client route {p}/{len} covers the server's own prefix or true address"),
            ));
        }
    }
    Ok(client_routes)
}

/// The clients' stream settings; `mode = "plain"` is refused.
fn stream_settings(src: &Source, s: &RawServer) -> Result<StreamSettings, ConfigError> {
    let stream = StreamSettings::parse(src, &s.stream_settings(), DEFAULT_JITTER)?;
    match &s.mode {
        Some(m) if stream.mode == Mode::Plain => Err(src.err(
            m,
            "the server role carries auth or encrypt streams only: plain mode has no tag, and a server cannot tell a forged datagram from a client's",
        )),
        _ => Ok(stream),
    }
}

/// `external_next_hop`: a router on the shared segment (so `neighbor_discovery` is on), outside
/// the hashed prefix.
fn external_next_hop(
    src: &Source,
    s: &RawServer,
    prefix: Ipv6Addr,
    neighbor_discovery: bool,
) -> Result<Option<Ipv6Addr>, ConfigError> {
    let Some(v) = &s.external_next_hop else {
        return Ok(None);
    };
    let a = address(src, v)?;
    if same64(a, prefix) {
        return Err(src.err(v, format!("external_next_hop {a} is inside the hashed prefix: give the router's address on the external link")));
    }
    if !neighbor_discovery {
        return Err(src.err(v, "external_next_hop primes the router of a shared segment with the next epoch's addresses; with neighbor_discovery = false the router routes the prefix to the server and needs no priming: remove it"));
    }
    Ok(Some(a))
}

/// A peers-file line and what is wrong with it.
type LineError = (usize, String);

/// Whether `a` and `b` share their /64.
pub fn same64(a: Ipv6Addr, b: Ipv6Addr) -> bool {
    u128::from(a) >> 64 == u128::from(b) >> 64
}

/// Whether `addr` is inside `prefix/len`.
pub fn covers(prefix: Ipv6Addr, len: u8, addr: Ipv6Addr) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    u128::from(prefix) & mask == u128::from(addr) & mask
}

fn route(src: &Source, v: &Spanned<String>) -> Result<(Ipv6Addr, u8), ConfigError> {
    let text = v.get_ref();
    let bad = || {
        src.err(
            v,
            format!("{text:?} is not a prefix (ADDRESS/LEN, LEN 16-128)"),
        )
    };
    let (addr, len) = text.split_once('/').ok_or_else(bad)?;
    let addr: Ipv6Addr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    if !(16..=128).contains(&len) {
        return Err(bad());
    }
    let masked = Ipv6Addr::from(u128::from(addr) & (u128::MAX << (128 - u32::from(len))));
    if masked != addr {
        return Err(src.err(
            v,
            format!("{text}: host bits set (the prefix is {masked}/{len})"),
        ));
    }
    Ok((addr, len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    const K1: &str = "Sr+Xbsk1zWOyZ4MmCjIK6v2PeqfaZrnpZNYN76oF8VM=";
    const K2: &str = "mU6VAR4mmhdjuZ3iQUEgSNXBwmsyjalqBFMKCsEYzHM=";

    fn example() -> String {
        r#"
[server]
external_interface = "eth0"
prefix = "2001:db8:5::/64"
true_address = "2001:db8:5:1::1"
peers_file = "clients"
client_routes = ["2001:db8:c0::/44"]
rotation_secs = 2
"#
        .to_string()
    }

    fn parse(text: &str) -> Result<ServerConfig, ConfigError> {
        ServerConfig::parse(Path::new("/etc/mt6d/server.toml"), text)
    }

    #[test]
    fn a_server_file_is_recognised_and_parsed() {
        assert!(ServerConfig::is_server_file(&example()));
        assert!(!ServerConfig::is_server_file(
            "[gateway]\nexternal_interface = \"x\"\n"
        ));
        let c = parse(&example()).unwrap();
        assert_eq!(c.peers_file, PathBuf::from("/etc/mt6d/clients"));
        assert_eq!(c.tun_name, DEFAULT_SERVER_TUN);
        assert_eq!(c.stream.rotation, Duration::from_secs(2));
        assert!(c.neighbor_discovery);
        assert_eq!(
            c.client_routes,
            vec![("2001:db8:c0::".parse().unwrap(), 44)]
        );
    }

    #[test]
    fn mistakes_name_the_line() {
        let e = parse(&example().replace("2001:db8:5:1::1", "2001:db8:5::1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/mt6d/server.toml:5:") && e.contains("inside the hashed prefix"),
            "{e}"
        );
        let e = parse(&format!("{}mode = \"plain\"\n", example()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(":9:") && e.contains("auth or encrypt"), "{e}");
        let e = parse(&example().replace("2001:db8:c0::/44", "2001:db8:c0::1/40"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("host bits"), "{e}");
        let e = parse(&example().replace("2001:db8:c0::/44", "2001:db8::/32"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("covers the server"), "{e}");
        let e = parse(&format!("{}surprise = 1\n", example()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(":9:"), "{e}");
    }

    #[test]
    fn clients_need_their_own_session_key_and_a_routed_address() {
        let c = parse(&example()).unwrap();
        let entries = |text: &str| peers_file::parse(text).unwrap();
        let ok = c
            .clients_from(&entries(&format!(
                "a {K1} 2001:db8:c1:1::1 key={K1} prefix=2001:db8:c1::/64\nb {K2} 2001:db8:c2::7 key={K2}"
            )))
            .unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].stream.local.external_prefix, Some(c.prefix));
        assert_eq!(ok[1].stream.remote.external_prefix, None);
        let e = c
            .clients_from(&entries(&format!("a {K1} 2001:db8:c1::1")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("handshakes"), "{e}");
        let e = c
            .clients_from(&entries(&format!(
                "a {K1} 2001:db8:c1::1 key={K1}\nb {K2} 2001:db8:c1::2 key={K1}"
            )))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("its own"), "{e}");
        let e = c
            .clients_from(&entries(&format!("a {K1} 2001:db8:99::1 key={K1}")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("client_routes"), "{e}");
    }

    #[test]
    fn clients_without_a_key_handshake_with_the_servers_identity_key() {
        let mut c = parse(&example()).unwrap();
        let private = PrivateKey::generate([5; 32]);
        c.private_key = Some(private.clone());
        let entries = |text: &str| peers_file::parse(text).unwrap();
        let own = keys::encode(private.public_key().as_bytes());
        let ok = c
            .clients_from(&entries(&format!(
                "a {K1} 2001:db8:c1:1::1 prefix=2001:db8:c1::/64
b {K2} 2001:db8:c2::7 key={K1}"
            )))
            .unwrap();
        let hs = ok[0].handshake.as_ref().expect("a handshakes");
        assert!(ok[1].handshake.is_none(), "b has a pre-shared key");
        // Its stream is keyed by the link key (docs/PROTOCOL.md §9.1), what the client computes.
        let link = mt6d_proto::handshake::link_key(
            &private,
            &hs.public_key,
            &Psk::none(),
            (c.true_address, ok[0].stream.remote.true_addr),
        )
        .unwrap();
        assert_eq!(ok[0].stream.key.as_bytes(), link.as_bytes());
        let template = c
            .handshake_config(hs, ok[0].stream.remote.true_addr)
            .unwrap();
        assert_eq!(template.remote_public, hs.public_key);
        assert_eq!(template.local_true, c.true_address);
        // Never the server's own identity (two clients with one key the peers file refuses).
        let e = c
            .clients_from(&entries(&format!("a {} 2001:db8:c1::1", &*own)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("server's own"), "{e}");
        // A low-order public key gives no link key: refused with its line.
        let zero = keys::encode(&[0u8; 32]);
        let e = c
            .clients_from(&entries(&format!(
                "a {K1} 2001:db8:c1::1\nz {} 2001:db8:c1::2",
                &*zero
            )))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("\"z\""), "{e}");
    }

    #[test]
    fn prefix_arithmetic() {
        let a: Ipv6Addr = "2001:db8:c0:ff::1".parse().unwrap();
        assert!(covers("2001:db8:c0::".parse().unwrap(), 40, a));
        assert!(!covers("2001:db8:c1::".parse().unwrap(), 48, a));
        assert!(covers(a, 128, a));
        assert!(same64(a, "2001:db8:c0:ff::".parse().unwrap()));
    }
}
