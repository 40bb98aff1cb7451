//! `[relay]`: one node of a relay network (seed 003; docs/CONFIG.md "The relay role"):
//! a relay, an edge gateway, or both. Validated here, before the daemon touches the OS; every
//! error names the file, line and column.

use std::collections::HashSet;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d_proto::handshake::{link_key, HandshakeConfig, PrivateKey, Psk};
use mt6d_proto::relay::frame::{DEFAULT_FRAME_MAX, MIN_FRAME_MAX};
use mt6d_proto::relay::NodeId;
use mt6d_proto::{Endpoint, Mode, SessionKey, StreamConfig};
use serde::Deserialize;
use toml::Spanned;

use super::raw::{address, interface_name, relative_to, RawStreamSettings, Source};
use super::server::same64;
use super::settings::{self, StreamSettings, DEFAULT_RELAY_JITTER};
use super::{rekey_packets_limit, ConfigError};
use crate::keys;

/// Default TUN device of an edge gateway (also names the nftables table and generation file of
/// a pure relay, which has no TUN device).
pub const DEFAULT_RELAY_TUN: &str = "mt6dr0";
/// Default local port of the transparent socket (never on the wire).
pub const DEFAULT_RELAY_LISTEN_PORT: u16 = 7411;
/// Bytes a link adds to a frame on the wire: IPv6 and UDP headers, the counter, the tag.
pub const LINK_WIRE_OVERHEAD: usize =
    40 + 8 + mt6d_proto::tunnel::FRAME_HEADROOM + mt6d_proto::tunnel::TAG_LEN;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelayFile {
    relay: Spanned<RawRelay>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRelay {
    external_interface: Spanned<String>,
    address: Spanned<String>,
    private_key_file: Option<Spanned<String>>,
    transit: Option<Spanned<bool>>,
    frame_max: Option<Spanned<i64>>,
    rotation_secs: Option<Spanned<f64>>,
    rekey_secs: Option<Spanned<f64>>,
    jitter: Option<Spanned<bool>>,
    listen_port: Option<Spanned<i64>>,
    neighbor_discovery: Option<Spanned<bool>>,
    workers: Option<Spanned<i64>>,
    tun_name: Option<Spanned<String>>,
    mtu: Option<Spanned<i64>>,
    state_dir: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
    metrics_listen: Option<Spanned<String>>,
    log_level: Option<Spanned<String>>,
    #[serde(default)]
    link: Vec<Spanned<RawLink>>,
    #[serde(default)]
    e2e: Vec<Spanned<RawE2e>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLink {
    name: Spanned<String>,
    address: Spanned<String>,
    interface: Option<Spanned<String>>,
    public_key: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawE2e {
    name: Spanned<String>,
    public_key: Spanned<String>,
    local_host: Spanned<String>,
    remote_host: Spanned<String>,
    key_file: Option<Spanned<String>>,
    rotation_secs: Option<Spanned<f64>>,
}

/// The validated relay node configuration.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub path: PathBuf,
    pub external_interface: String,
    /// This node's address on the relay network; its /64 is the node's hashed prefix.
    pub address: Ipv6Addr,
    /// The node's id, from its identity key (None: a pure relay without one).
    pub node_id: Option<NodeId>,
    pub transit: bool,
    pub frame_max: usize,
    /// The links' stream settings: `rotation_secs` and `jitter` (on by default) from the file,
    /// always `encrypt` with the default AEAD, derivation and hopping ports. An end-to-end peer
    /// takes them too, with a `rotation_secs` of its own if it gives one.
    pub stream: StreamSettings,
    /// The links' rekey interval (handshake-keyed links).
    pub rekey_after: Duration,
    pub listen_port: u16,
    /// Answer Neighbour Solicitations for the links' current hashed addresses on the external
    /// interface and every link's own (a neighbour on a shared segment resolves them); false
    /// where each node's /64 is routed to it.
    pub neighbor_discovery: bool,
    /// `workers`: data-plane threads, each with its own transparent socket (SO_REUSEPORT: the
    /// kernel keeps one link's datagrams of an epoch on one of them) and, at an edge, its own
    /// TUN queue. None: one per online CPU.
    pub workers: Option<usize>,
    pub tun_name: String,
    pub mtu: u16,
    pub state_dir: PathBuf,
    pub control_socket: PathBuf,
    /// `metrics_listen`: address and port of the Prometheus endpoint (`GET /metrics`); off
    /// when unset.
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub log_level: Option<log::LevelFilter>,
    pub links: Vec<LinkConfig>,
    pub e2e: Vec<E2eConfig>,
}

/// One neighbour: the link's encrypt-mode stream between the two nodes' addresses.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    pub name: String,
    pub address: Ipv6Addr,
    /// The interface the neighbour is reached on (default: `external_interface`).
    pub interface: String,
    /// Keyed by the handshake's link key (`public_key` given) or the pre-shared key.
    pub stream: StreamConfig,
    /// Noise IK with the neighbour's identity (`public_key`, with `key_file` as its optional
    /// extra pre-shared key); None: the stream's key is pre-shared (`key_file` alone).
    pub handshake: Option<HandshakeConfig>,
}

/// One end-to-end peer of an edge gateway: the stream between two protected hosts.
#[derive(Debug, Clone)]
pub struct E2eConfig {
    pub name: String,
    pub destination: NodeId,
    /// Keyed by the handshake's link key.
    pub stream: StreamConfig,
    /// Noise IK between the two edge gateways' identities, carried through the relays, with
    /// `key_file` as its optional extra pre-shared key. Always set by the file parser; None
    /// only for a caller that builds a pre-shared end-to-end stream itself.
    pub handshake: Option<HandshakeConfig>,
}

impl RelayConfig {
    /// The interfaces the node's links leave on: `external_interface` and every link's own,
    /// each once.
    pub fn link_interfaces(&self) -> Vec<&str> {
        let mut all = vec![self.external_interface.as_str()];
        for l in &self.links {
            if !all.contains(&l.interface.as_str()) {
                all.push(&l.interface);
            }
        }
        all
    }

    /// Whether `text` is a relay node's file (a `[relay]` table).
    pub fn is_relay_file(text: &str) -> bool {
        text.parse::<toml::Table>()
            .is_ok_and(|t| t.contains_key("relay"))
    }

    /// Reads and validates a relay configuration, key files included.
    pub fn load(path: &Path) -> Result<RelayConfig, ConfigError> {
        RelayConfig::parse(path, &super::source::read(path)?)
    }

    /// Validates configuration text (`path` names the file and anchors relative paths).
    pub fn parse(path: &Path, text: &str) -> Result<RelayConfig, ConfigError> {
        let src = Source { path, text };
        let raw: RawRelayFile = src.parse_toml()?;
        let r = raw.relay.get_ref();
        let external_interface = interface_name(&src, &r.external_interface)?;
        let own = address(&src, &r.address)?;
        let (private_key, node_id) = identity(&src, r)?;
        let (frame_max, mtu) = frame_max_and_mtu(&src, r)?;
        let stream = link_settings(&src, r)?;
        let rekey_after = settings::rekey_after(&src, r.rekey_secs.as_ref())?;
        let ctx = Ctx {
            src: &src,
            own,
            external_interface: &external_interface,
            private_key: &private_key,
            private_key_file: &r.private_key_file,
            node_id,
            rekey_after,
            stream,
        };
        let (links, e2e) = neighbours(&ctx, &raw.relay)?;
        let transit = match &r.transit {
            Some(t) => *t.get_ref(),
            None => e2e.is_empty(),
        };
        if !transit && e2e.is_empty() {
            return Err(src.err(&raw.relay, "transit = false and no [[relay.e2e]]: this node would neither forward nor carry anything"));
        }
        let tun_name = settings::tun_name(&src, r.tun_name.as_ref(), DEFAULT_RELAY_TUN)?;
        let listen_port =
            settings::listen_port(&src, r.listen_port.as_ref(), DEFAULT_RELAY_LISTEN_PORT)?;
        let log_level = settings::log_level(&src, r.log_level.as_ref())?;
        let metrics_listen = settings::metrics_listen(&src, r.metrics_listen.as_ref())?;
        let control_socket =
            settings::control_socket(&src, r.control_socket.as_ref(), &raw.relay, &tun_name)?;
        Ok(RelayConfig {
            path: path.to_path_buf(),
            external_interface,
            address: own,
            node_id,
            transit,
            frame_max,
            stream,
            rekey_after,
            listen_port,
            neighbor_discovery: settings::neighbor_discovery(r.neighbor_discovery.as_ref()),
            workers: settings::workers(&src, r.workers.as_ref())?,
            tun_name,
            mtu,
            state_dir: settings::state_dir(&src, r.state_dir.as_ref())?,
            control_socket,
            metrics_listen,
            log_level,
            links,
            e2e,
        })
    }

    /// The node's hashed /64 (the high 64 bits of `address`).
    pub fn prefix(&self) -> Ipv6Addr {
        prefix_of(self.address)
    }

    /// Whether this node is an edge gateway (it has end-to-end peers and a TUN device).
    pub fn is_edge(&self) -> bool {
        !self.e2e.is_empty()
    }

    /// The number of data-plane workers to start: `workers`, or one per online CPU.
    pub fn worker_count(&self) -> usize {
        super::worker_count(self.workers)
    }

    /// The keys whose values differ between `self` and `other` and that a running node cannot
    /// take (a reload that changes one is refused whole), in the order of docs/CONFIG.md:
    /// everything but the `[[relay.link]]` tables (empty when only links differ). Every field is
    /// taken apart here, so a new setting cannot be left out of the comparison.
    pub fn changed_keys(&self, other: &RelayConfig) -> Vec<&'static str> {
        let RelayConfig {
            path: _,
            external_interface,
            address,
            node_id,
            transit,
            frame_max,
            stream,
            rekey_after,
            listen_port,
            neighbor_discovery,
            workers,
            tun_name,
            mtu,
            state_dir,
            control_socket,
            metrics_listen,
            log_level,
            links: _,
            e2e,
        } = self;
        let e2e_of = |c: &RelayConfig| c.e2e.iter().map(E2eConfig::fingerprint).collect::<Vec<_>>();
        let differs = [
            (
                *external_interface != other.external_interface,
                "external_interface",
            ),
            (*address != other.address, "address"),
            // The node id is the identity key's: a new key is a new id.
            (*node_id != other.node_id, "private_key_file"),
            (*transit != other.transit, "transit"),
            (*frame_max != other.frame_max, "frame_max"),
            (stream.rotation != other.stream.rotation, "rotation_secs"),
            (*rekey_after != other.rekey_after, "rekey_secs"),
            (stream.jitter != other.stream.jitter, "jitter"),
            (*listen_port != other.listen_port, "listen_port"),
            (
                *neighbor_discovery != other.neighbor_discovery,
                "neighbor_discovery",
            ),
            (*workers != other.workers, "workers"),
            (*tun_name != other.tun_name, "tun_name"),
            (*mtu != other.mtu, "mtu"),
            (*state_dir != other.state_dir, "state_dir"),
            (*control_socket != other.control_socket, "control_socket"),
            (*metrics_listen != other.metrics_listen, "metrics_listen"),
            (*log_level != other.log_level, "log_level"),
            (
                e2e.len() != other.e2e.len() || e2e_of(self) != e2e_of(other),
                "[[relay.e2e]]",
            ),
        ];
        differs
            .into_iter()
            .filter_map(|(changed, key)| changed.then_some(key))
            .collect()
    }
}

impl LinkConfig {
    /// Everything the running link is made of, its keys as a digest: two links with the same
    /// fingerprint are the same link (a handshake link's stream key is its link key, which the
    /// identities and the extra pre-shared key make).
    pub fn fingerprint(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.stream.key.as_bytes());
        format!(
            "{} {} {} {:?} {:?} {digest:x}",
            self.name, self.address, self.interface, self.stream, self.handshake
        )
    }
}

impl E2eConfig {
    /// As [`LinkConfig::fingerprint`].
    pub fn fingerprint(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.stream.key.as_bytes());
        format!(
            "{} {} {:?} {:?} {digest:x}",
            self.name, self.destination, self.stream, self.handshake
        )
    }
}

/// The /64 holding `a`.
pub fn prefix_of(a: Ipv6Addr) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(a) & !((1u128 << 64) - 1))
}

/// `private_key_file` and the node id it gives (both None for a pure relay without one).
fn identity(
    src: &Source,
    r: &RawRelay,
) -> Result<(Option<PrivateKey>, Option<NodeId>), ConfigError> {
    let private_key = settings::private_key(src, r.private_key_file.as_ref())?;
    let node_id = match (&private_key, &r.private_key_file) {
        (Some(k), Some(f)) => Some(NodeId::from_public_key(&k.public_key()).ok_or_else(
            || src.err(f, "this key's node id is the reserved all-zero id (probability 2^-64): make another key"),
        )?),
        _ => None,
    };
    Ok((private_key, node_id))
}

/// `frame_max` and `mtu`: a frame and a link's headers fit the external path.
fn frame_max_and_mtu(src: &Source, r: &RawRelay) -> Result<(usize, u16), ConfigError> {
    let frame_max = match &r.frame_max {
        None => DEFAULT_FRAME_MAX,
        Some(f) => usize::try_from(*f.get_ref())
            .ok()
            .filter(|m| (MIN_FRAME_MAX..=9000).contains(m))
            .ok_or_else(|| {
                src.err(
                    f,
                    format!("frame_max must be {MIN_FRAME_MAX}-9000, the same on every node"),
                )
            })?,
    };
    let mtu = settings::mtu(src, r.mtu.as_ref())?;
    if frame_max + LINK_WIRE_OVERHEAD > usize::from(mtu) {
        return Err(src.err_at(
            r.frame_max.as_ref().map_or(r.address.span(), Spanned::span),
            format!(
                "frame_max {frame_max} needs an external MTU of {} (frame + {LINK_WIRE_OVERHEAD} bytes of IPv6, UDP, counter and tag), and mtu is {mtu}: lower frame_max on every node or raise mtu",
                frame_max + LINK_WIRE_OVERHEAD
            ),
        ));
    }
    Ok((frame_max, mtu))
}

/// The links' stream settings: `rotation_secs` and `jitter` as written, `encrypt` always.
fn link_settings(src: &Source, r: &RawRelay) -> Result<StreamSettings, ConfigError> {
    let written = RawStreamSettings {
        rotation_secs: r.rotation_secs.clone(),
        jitter: r.jitter.clone(),
        ..RawStreamSettings::default()
    };
    let parsed = StreamSettings::parse(src, &written, DEFAULT_RELAY_JITTER)?;
    Ok(StreamSettings {
        mode: Mode::Encrypt,
        ..parsed
    })
}

/// Every `[[relay.link]]` (at least one), then every `[[relay.e2e]]`, each checked against
/// those before it: names shared by both and unique, a key per link and pair.
fn neighbours(
    ctx: &Ctx,
    relay: &Spanned<RawRelay>,
) -> Result<(Vec<LinkConfig>, Vec<E2eConfig>), ConfigError> {
    let r = relay.get_ref();
    let mut names = HashSet::new();
    let mut links = Vec::with_capacity(r.link.len());
    let mut link_keys: Vec<(zeroize::Zeroizing<Vec<u8>>, String)> = Vec::new();
    for l in &r.link {
        let link = parse_link(ctx, l, &mut names, &links, &mut link_keys)?;
        links.push(link);
    }
    if links.is_empty() {
        return Err(ctx.src.err(
            relay,
            "no [[relay.link]]: a node needs at least one neighbour",
        ));
    }
    let mut e2e = Vec::with_capacity(r.e2e.len());
    let mut pairs = HashSet::new();
    for e in &r.e2e {
        let peer = parse_e2e(ctx, e, &mut names, (&links, &mut pairs), &mut link_keys)?;
        e2e.push(peer);
    }
    Ok((links, e2e))
}

/// What every `[[relay.link]]` and `[[relay.e2e]]` is checked and built with.
struct Ctx<'a> {
    src: &'a Source<'a>,
    own: Ipv6Addr,
    external_interface: &'a str,
    private_key: &'a Option<PrivateKey>,
    private_key_file: &'a Option<Spanned<String>>,
    node_id: Option<NodeId>,
    rekey_after: Duration,
    /// The links' stream settings.
    stream: StreamSettings,
}

/// One `[[relay.link]]`, checked against the links before it (`links`) and the keys every link
/// and pair uses (`keys`, which it joins).
fn parse_link(
    ctx: &Ctx,
    l: &Spanned<RawLink>,
    names: &mut HashSet<String>,
    links: &[LinkConfig],
    link_keys: &mut Vec<(zeroize::Zeroizing<Vec<u8>>, String)>,
) -> Result<LinkConfig, ConfigError> {
    let raw_link = l.get_ref();
    let name = raw_link.name.get_ref().clone();
    if name.is_empty() || !names.insert(name.clone()) {
        return Err(ctx.src.err(
            &raw_link.name,
            format!("link name {name:?} is empty or used twice"),
        ));
    }
    let addr = address(ctx.src, &raw_link.address)?;
    if same64(addr, ctx.own) {
        return Err(ctx.src.err(&raw_link.address, format!("link {name:?}: {addr} is in this node's own /64 {}; every node needs a /64 of its own", prefix_of(ctx.own))));
    }
    if let Some(other) = links.iter().find(|o: &&LinkConfig| same64(o.address, addr)) {
        return Err(ctx.src.err(&raw_link.address, format!("link {name:?}: {addr} shares a /64 with link {:?}; every node needs a /64 of its own", other.name)));
    }
    let secret = raw_link
        .key_file
        .as_ref()
        .map(|f| key_file(ctx.src, f).map(|k| (k, f)))
        .transpose()?;
    let (key, handshake) = match (&raw_link.public_key, secret) {
        (None, None) => {
            return Err(ctx.src.err(l, format!("link {name:?}: give public_key (the neighbour's, `mt6d pubkey` there: Noise IK handshakes) or key_file (a pre-shared key, `mt6d genpsk`)")));
        }
        (None, Some((key, f))) => {
            if let Some((_, other)) = link_keys.iter().find(|(k, _)| k[..] == *key.as_bytes()) {
                return Err(ctx.src.err(f, format!("link {name:?} uses the same key as {other:?}: give every link its own key (`mt6d genpsk`)")));
            }
            link_keys.push((
                zeroize::Zeroizing::new(key.as_bytes().to_vec()),
                name.clone(),
            ));
            (key, None)
        }
        (Some(public), secret) => {
            let (Some(private), Some(_)) = (ctx.private_key, ctx.private_key_file) else {
                return Err(ctx.src.err(public, format!("link {name:?}: a handshake needs this node's identity: set private_key_file (`mt6d keygen FILE`)")));
            };
            let remote_public = keys::public_key(public.get_ref(), "public_key")
                .map_err(|e| ctx.src.err(public, e))?;
            if remote_public == private.public_key() {
                return Err(ctx.src.err(public, format!("link {name:?}: this is the node's own public key: give the neighbour's (`mt6d pubkey FILE` there)")));
            }
            if let Some(other) = links.iter().find(|o: &&LinkConfig| {
                o.handshake
                    .as_ref()
                    .is_some_and(|h| h.remote_public == remote_public)
            }) {
                return Err(ctx.src.err(public, format!("link {name:?} has the same public key as link {:?}: one link per neighbour", other.name)));
            }
            let psk = match secret {
                Some((k, f)) => psk_of(ctx.src, f, &k)?,
                None => Psk::none(),
            };
            let (key, hs) = handshake(private, remote_public, psk, (ctx.own, addr), ctx)
                .map_err(|e| ctx.src.err(public, format!("link {name:?}: {e}")))?;
            (key, Some(hs))
        }
    };
    let stream = ctx
        .stream
        .stream(Endpoint::new(ctx.own), Endpoint::new(addr), key);
    let interface = match &raw_link.interface {
        Some(i) => interface_name(ctx.src, i)?,
        None => ctx.external_interface.to_string(),
    };
    Ok(LinkConfig {
        name,
        address: addr,
        interface,
        stream,
        handshake,
    })
}

/// One `[[relay.e2e]]`, checked against the links, the pairs before it and every key in use.
fn parse_e2e(
    ctx: &Ctx,
    e: &Spanned<RawE2e>,
    names: &mut HashSet<String>,
    (links, pairs): (&[LinkConfig], &mut HashSet<(Ipv6Addr, Ipv6Addr)>),
    link_keys: &mut Vec<(zeroize::Zeroizing<Vec<u8>>, String)>,
) -> Result<E2eConfig, ConfigError> {
    let raw_e = e.get_ref();
    let name = raw_e.name.get_ref().clone();
    if name.is_empty() || !names.insert(name.clone()) {
        return Err(ctx.src.err(
            &raw_e.name,
            format!(
                "name {name:?} is empty or used twice (links and end-to-end peers share names)"
            ),
        ));
    }
    if ctx.node_id.is_none() {
        return Err(ctx.src.err(e, "an end-to-end peer needs this node's identity: set private_key_file (`mt6d keygen FILE`)"));
    }
    let public = keys::public_key(raw_e.public_key.get_ref(), "public_key")
        .map_err(|err| ctx.src.err(&raw_e.public_key, err))?;
    let destination = NodeId::from_public_key(&public).ok_or_else(|| {
        ctx.src
            .err(&raw_e.public_key, "this key's node id is reserved")
    })?;
    if Some(destination) == ctx.node_id {
        return Err(ctx.src.err(&raw_e.public_key, "this is the node's own public key: give the other edge gateway's (`mt6d pubkey FILE` there)"));
    }
    let local = address(ctx.src, &raw_e.local_host)?;
    let remote = address(ctx.src, &raw_e.remote_host)?;
    for (a, at) in [(local, &raw_e.local_host), (remote, &raw_e.remote_host)] {
        if same64(a, ctx.own) || links.iter().any(|l| same64(l.address, a)) {
            return Err(ctx.src.err(
                at,
                format!("{a} is inside a relay node's /64: hosts need addresses of their own"),
            ));
        }
    }
    if local == remote || !pairs.insert((local, remote)) {
        return Err(ctx.src.err(
            &raw_e.remote_host,
            format!("{local} -> {remote} is given twice, or one address twice"),
        ));
    }
    let psk = match &raw_e.key_file {
        None => Psk::none(),
        Some(f) => {
            let key = key_file(ctx.src, f)?;
            if link_keys.iter().any(|(k, _)| k[..] == *key.as_bytes()) {
                return Err(ctx.src.err(f, format!("end-to-end peer {name:?} uses a key that is already used: give every link and pair its own key")));
            }
            link_keys.push((
                zeroize::Zeroizing::new(key.as_bytes().to_vec()),
                name.clone(),
            ));
            psk_of(ctx.src, f, &key)?
        }
    };
    // node_id is set (checked above), so the identity is there.
    let Some(private) = ctx.private_key else {
        return Err(ctx.src.err(e, "an end-to-end peer needs this node's identity: set private_key_file (`mt6d keygen FILE`)"));
    };
    let (key, handshake) =
        handshake(private, public, psk, (local, remote), ctx).map_err(|err| {
            ctx.src.err(
                &raw_e.public_key,
                format!("end-to-end peer {name:?}: {err}"),
            )
        })?;
    let settings = StreamSettings {
        rotation: match &raw_e.rotation_secs {
            Some(r) => settings::rotation(ctx.src, Some(r))?,
            None => ctx.stream.rotation,
        },
        ..ctx.stream
    };
    let stream = settings.stream(Endpoint::new(local), Endpoint::new(remote), key);
    Ok(E2eConfig {
        name,
        destination,
        stream,
        handshake: Some(handshake),
    })
}

/// A pre-shared key from a file (mode 0600, base64).
/// A key file's key as a handshake's extra pre-shared key (32 bytes).
fn psk_of(src: &Source, f: &Spanned<String>, key: &SessionKey) -> Result<Psk, ConfigError> {
    <[u8; 32]>::try_from(key.as_bytes())
        .map(Psk::from_bytes)
        .map_err(|_| src.err(f, "key_file must hold a 32-byte key"))
}

/// A stream keyed by Noise IK between this node's identity and `remote_public`, with the true
/// addresses `(local, remote)` (a link: the two nodes'; end to end: the two hosts'): the
/// handshake's link key (the stream's key, §9.1) and its settings, the links' mode and AEAD.
fn handshake(
    private: &PrivateKey,
    remote_public: mt6d_proto::handshake::PublicKey,
    psk: Psk,
    (local, remote): (Ipv6Addr, Ipv6Addr),
    ctx: &Ctx,
) -> Result<(SessionKey, HandshakeConfig), mt6d_proto::ProtoError> {
    let key = link_key(private, &remote_public, &psk, (local, remote))?;
    let aead = ctx.stream.aead;
    Ok((
        key,
        HandshakeConfig {
            local_private: private.clone(),
            remote_public,
            psk,
            mode: ctx.stream.mode,
            aead,
            local_true: local,
            remote_true: remote,
            rekey_after: ctx.rekey_after,
            rekey_after_packets: rekey_packets_limit(aead),
        },
    ))
}

fn key_file(src: &Source, f: &Spanned<String>) -> Result<SessionKey, ConfigError> {
    let file = relative_to(src.path, f.get_ref());
    let text = keys::read_secret_file(&file).map_err(|e| src.err(f, e))?;
    let bytes = keys::decode(&text, "key").map_err(|e| src.err(f, e))?;
    SessionKey::from_bytes(&bytes).map_err(|e| src.err(f, e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("mt6d-relaycfg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for (name, byte) in [("l1.key", 1u8), ("l2.key", 2), ("e.key", 3)] {
            let p = d.join(name);
            std::fs::write(&p, keys::encode(&[byte; 32]).as_bytes()).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let k = keys::new_private_key().unwrap();
        keys::write_secret_file(&d.join("id.key"), &keys::encode(&k.to_bytes()[..])).unwrap();
        Dir(d)
    }

    fn other_public() -> String {
        keys::public_key_text(&keys::new_private_key().unwrap().public_key())
    }

    const RELAY: &str = r#"
[relay]
external_interface = "eth0"
address = "2001:db8:ff:1::1"
control_socket = "/tmp/mt6d-relaycfg-test.sock"
[[relay.link]]
name = "r2"
address = "2001:db8:ff:2::1"
key_file = "l1.key"
[[relay.link]]
name = "r3"
address = "2001:db8:ff:3::1"
key_file = "l2.key"
"#;

    #[test]
    fn a_pure_relay_is_transit_with_encrypt_links_between_the_nodes_addresses() {
        let d = dir("relay");
        let c = RelayConfig::parse(&d.0.join("r.toml"), RELAY).unwrap();
        assert!(c.transit && !c.is_edge() && c.node_id.is_none());
        assert_eq!(c.links.len(), 2);
        assert_eq!(c.links[1].stream.mode, Mode::Encrypt);
        assert_eq!(
            c.links[1].stream.remote.true_addr,
            "2001:db8:ff:3::1".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(c.prefix(), "2001:db8:ff:1::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(c.frame_max, DEFAULT_FRAME_MAX);
        // Links leave on the external interface unless they name their own; solicitations
        // are answered on each, once.
        assert!(c.neighbor_discovery);
        assert_eq!(c.link_interfaces(), vec!["eth0"]);
        let own_if = RELAY.replacen(
            "address = \"2001:db8:ff:3::1\"",
            "address = \"2001:db8:ff:3::1\"\ninterface = \"eth1\"",
            1,
        );
        let c = RelayConfig::parse(&d.0.join("r.toml"), &own_if).unwrap();
        assert_eq!(c.links[0].interface, "eth0");
        assert_eq!(c.link_interfaces(), vec!["eth0", "eth1"]);
        let off = RELAY.replace(
            "control_socket",
            "neighbor_discovery = false\ncontrol_socket",
        );
        assert!(
            !RelayConfig::parse(&d.0.join("r.toml"), &off)
                .unwrap()
                .neighbor_discovery
        );
    }

    /// The links' stream settings: jitter on unless set off, encrypt, the rotation written (an
    /// end-to-end peer's own if it gives one); `state_dir` relative to the file, as the
    /// gateway's and the server's.
    #[test]
    fn links_take_the_relay_stream_settings_and_state_dir_is_relative_to_the_file() {
        let d = dir("settings");
        let path = d.0.join("r.toml");
        let c = RelayConfig::parse(&path, RELAY).unwrap();
        assert!(c.stream.jitter && c.links[0].stream.jitter);
        assert_eq!(c.stream.mode, Mode::Encrypt);
        assert_eq!(c.links[1].stream.rotation, super::super::DEFAULT_ROTATION);
        assert_eq!(c.state_dir, PathBuf::from(super::super::DEFAULT_STATE_DIR));
        let text = RELAY.replace(
            "control_socket",
            "jitter = false\nrotation_secs = 3\nstate_dir = \"state\"\ncontrol_socket",
        );
        let c = RelayConfig::parse(&path, &text).unwrap();
        assert!(!c.links[0].stream.jitter);
        assert_eq!(c.links[0].stream.rotation, Duration::from_secs(3));
        assert_eq!(c.state_dir, d.0.join("state"));
        let bad = RELAY.replace("control_socket", "rotation_secs = 0\ncontrol_socket");
        let e = RelayConfig::parse(&path, &bad).unwrap_err().to_string();
        assert!(
            e.contains("r.toml:5:") && e.contains("rotation_secs 0 out of range"),
            "{e}"
        );
    }

    #[test]
    fn workers_default_to_the_cpus_and_a_bad_count_names_its_line() {
        let d = dir("relay-workers");
        let path = d.0.join("r.toml");
        let c = RelayConfig::parse(&path, RELAY).unwrap();
        assert_eq!(c.workers, None);
        assert!((1..=super::super::MAX_WORKERS).contains(&c.worker_count()));
        let three = RELAY.replace("control_socket", "workers = 3\ncontrol_socket");
        assert_eq!(RelayConfig::parse(&path, &three).unwrap().worker_count(), 3);
        for bad in ["0", "65", "-1"] {
            let text = RELAY.replace(
                "control_socket",
                &format!("workers = {bad}\ncontrol_socket"),
            );
            let err = RelayConfig::parse(&path, &text).unwrap_err().to_string();
            assert!(
                err.contains("workers: the number of data-plane threads, 1 to 64"),
                "{err}"
            );
            assert!(err.contains("r.toml:"), "{err}");
        }
    }

    #[test]
    fn an_edge_needs_its_identity_and_its_hosts_outside_the_nodes_prefixes() {
        let d = dir("edge");
        let e2e = format!(
            "[[relay.e2e]]\nname = \"ab\"\npublic_key = \"{}\"\nlocal_host = \"fd00:a::10\"\nremote_host = \"fd00:b::10\"\nkey_file = \"e.key\"\n",
            other_public()
        );
        let text = format!("{RELAY}{e2e}");
        let err = RelayConfig::parse(&d.0.join("r.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("private_key_file"), "{err}");
        let with_id = text.replace(
            "address = \"2001:db8:ff:1::1\"",
            "address = \"2001:db8:ff:1::1\"\nprivate_key_file = \"id.key\"",
        );
        let c = RelayConfig::parse(&d.0.join("r.toml"), &with_id).unwrap();
        assert!(c.is_edge() && !c.transit && c.node_id.is_some());
        let inside = with_id.replace("fd00:b::10", "2001:db8:ff:2::99");
        let err = RelayConfig::parse(&d.0.join("r.toml"), &inside)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("inside a relay node's /64") && err.contains(":19:"),
            "{err}"
        );
    }

    #[test]
    fn shared_keys_and_prefixes_and_oversized_frames_are_refused_with_their_line() {
        let d = dir("refuse");
        let p = d.0.join("r.toml");
        let same_key = RELAY.replacen("l2.key", "l1.key", 1);
        let err = RelayConfig::parse(&p, &same_key).unwrap_err().to_string();
        assert!(err.contains("same key") && err.contains(":13:"), "{err}");
        let same64 = RELAY.replace("2001:db8:ff:3::1", "2001:db8:ff:2::2");
        let err = RelayConfig::parse(&p, &same64).unwrap_err().to_string();
        assert!(err.contains("shares a /64"), "{err}");
        let own = RELAY.replace("2001:db8:ff:3::1", "2001:db8:ff:1::2");
        let err = RelayConfig::parse(&p, &own).unwrap_err().to_string();
        assert!(err.contains("own /64"), "{err}");
        let big = RELAY.replace(
            "address = \"2001:db8:ff:1::1\"",
            "address = \"2001:db8:ff:1::1\"\nframe_max = 1450",
        );
        let err = RelayConfig::parse(&p, &big).unwrap_err().to_string();
        assert!(err.contains("external MTU of 1522"), "{err}");
        let none = "[relay]\nexternal_interface = \"eth0\"\naddress = \"2001:db8:ff:1::1\"\n";
        let err = RelayConfig::parse(&p, none).unwrap_err().to_string();
        assert!(err.contains("at least one neighbour"), "{err}");
    }

    #[test]
    fn a_link_with_a_public_key_is_keyed_by_handshakes_and_its_key_file_is_the_psk() {
        let d = dir("handshake");
        let p = d.0.join("r.toml");
        let (pa, pb) = (other_public(), other_public());
        let text = RELAY
            .replace(
                "address = \"2001:db8:ff:1::1\"",
                "address = \"2001:db8:ff:1::1\"\nprivate_key_file = \"id.key\"\nrekey_secs = 30",
            )
            .replacen(
                "key_file = \"l1.key\"",
                &format!("public_key = \"{pa}\""),
                1,
            )
            .replacen(
                "key_file = \"l2.key\"",
                &format!("public_key = \"{pb}\"\nkey_file = \"l2.key\""),
                1,
            );
        let c = RelayConfig::parse(&p, &text).unwrap();
        // A pure relay: its identity keys its links, it is no destination.
        assert!(c.transit && !c.is_edge());
        let (h0, h1) = (
            c.links[0].handshake.as_ref().unwrap(),
            c.links[1].handshake.as_ref().unwrap(),
        );
        assert_eq!(h0.rekey_after, Duration::from_secs(30));
        assert_eq!(h0.local_true, c.address);
        assert_eq!(h1.remote_true, c.links[1].address);
        assert_eq!(h0.mode, Mode::Encrypt);
        // The stream is keyed by the handshake's link key, and the psk changes it.
        let trues = (h1.local_true, h1.remote_true);
        let no_psk = link_key(&h1.local_private, &h1.remote_public, &Psk::none(), trues).unwrap();
        let with_psk = link_key(&h1.local_private, &h1.remote_public, &h1.psk, trues).unwrap();
        assert_eq!(c.links[1].stream.key.as_bytes(), with_psk.as_bytes());
        assert_ne!(no_psk.as_bytes(), with_psk.as_bytes());

        let without_id = text.replace("private_key_file = \"id.key\"\n", "");
        let err = RelayConfig::parse(&p, &without_id).unwrap_err().to_string();
        assert!(
            err.contains("private_key_file") && err.contains("\"r2\""),
            "{err}"
        );
        let twice = text.replace(&pb, &pa);
        let err = RelayConfig::parse(&p, &twice).unwrap_err().to_string();
        assert!(err.contains("same public key as link \"r2\""), "{err}");
        let neither = RELAY.replacen("key_file = \"l1.key\"\n", "", 1);
        let err = RelayConfig::parse(&p, &neither).unwrap_err().to_string();
        assert!(
            err.contains("give public_key") && err.contains(":6:"),
            "{err}"
        );
    }
}
