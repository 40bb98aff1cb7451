//! `[[peer]]`: a peer's name and true addresses (checked against the peers before it), its keys
//! (pre-shared, or a handshake's), and its stream, built once to be validated.

use std::collections::HashSet;
use std::net::Ipv6Addr;

use mt6d_proto::handshake::{link_key, HandshakeConfig, Psk};
use mt6d_proto::{Endpoint, Mode, SessionKey, Stream, StreamConfig};
use toml::Spanned;

use super::gateway::GatewaySection;
use super::raw::{
    address, mac, merge, prefix64, relative_to, RawGateway, RawPeer, RawStreamSettings, Source,
};
use super::settings::{StreamSettings, DEFAULT_JITTER};
use super::{rekey_packets_limit, ConfigError, Keying, PeerConfig};
use crate::keys;

/// What the peers validated so far claim, for the checks across peers.
#[derive(Default)]
pub(super) struct PeersSeen {
    pub(super) names: HashSet<String>,
    pub(super) pairs: HashSet<(Ipv6Addr, Ipv6Addr)>,
    /// Host mode: the one address of this host, from the first peer; the others must agree.
    pub(super) host_address: Option<Ipv6Addr>,
    /// Pre-shared keys already used, with the true addresses of their streams: a key may serve
    /// several streams only if no true address is shared (docs/PROTOCOL.md §4.3).
    pub(super) pre_shared: Vec<(zeroize::Zeroizing<Vec<u8>>, Ipv6Addr, Ipv6Addr, String)>,
}

/// One `[[peer]]` whose name and true addresses passed, with its merged stream settings (as
/// written, for the places of errors, and validated).
struct PeerDraft<'a> {
    raw: &'a Spanned<RawPeer>,
    name: String,
    local_true: Ipv6Addr,
    remote_true: Ipv6Addr,
    written: RawStreamSettings,
    settings: StreamSettings,
}

/// One `[[peer]]`: its name and addresses, its keys, its stream; then the stream (and its
/// handshake) built once, so that anything the protocol layer rejects is reported here,
/// against this peer's lines.
pub(super) fn parse_peer(
    src: &Source,
    gw: &RawGateway,
    section: &GatewaySection,
    peer: &Spanned<RawPeer>,
    seen: &mut PeersSeen,
) -> Result<PeerConfig, ConfigError> {
    let p = peer.get_ref();
    let (name, local_true, remote_true) = peer_hosts(src, p, section.host_role, seen)?;
    let written = merge(&gw.stream_settings(), &p.stream_settings());
    let draft = PeerDraft {
        raw: peer,
        name,
        local_true,
        remote_true,
        settings: StreamSettings::parse(src, &written, DEFAULT_JITTER)?,
        written,
    };
    clear_payload_acknowledged(src, gw, &draft)?;
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
        host_id: Default::default(),
    })
}

/// `plain` and `auth` carry the inner packet in clear (docs/PROTOCOL.md §9.7): the true
/// addresses are removed from the inner header only, and those inside the payload (the quote of
/// an ICMPv6 error, a routing header's segments, what the application writes) reach the public
/// link. Refused unless `[gateway] accept_clear_payload = true` says the operator knows.
fn clear_payload_acknowledged(
    src: &Source,
    gw: &RawGateway,
    draft: &PeerDraft,
) -> Result<(), ConfigError> {
    let acknowledged = gw
        .accept_clear_payload
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if draft.settings.mode == Mode::Encrypt || acknowledged {
        return Ok(());
    }
    let mode = match draft.settings.mode {
        Mode::Plain => "plain",
        _ => "auth",
    };
    let message = format!(
        "peer {:?}: mode \"{mode}\" sends the inner packet in clear, and the true addresses inside it (ICMPv6 error quotes, routing headers, application data) with it: an observer of the public link reads them. Use mode \"encrypt\", or set [gateway] accept_clear_payload = true to run it anyway (docs/PROTOCOL.md §9.7)",
        draft.name
    );
    Err(match &draft.written.mode {
        Some(m) => src.err(m, message),
        None => src.err(&draft.raw.get_ref().name, message),
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
    let (name, mode, aead) = (&draft.name, draft.settings.mode, draft.settings.aead);
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
    let key = link_key(
        private,
        &remote_public,
        &psk,
        (draft.local_true, draft.remote_true),
    )
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

/// The protocol crate's stream of a peer: its endpoints (prefixes and MACs), its key and its
/// stream settings.
fn stream_config(
    src: &Source,
    draft: &PeerDraft,
    key: SessionKey,
) -> Result<StreamConfig, ConfigError> {
    let p = draft.raw.get_ref();
    let endpoint =
        |true_addr, prefix: &Option<Spanned<String>>, mac_text: &Option<Spanned<String>>| {
            Ok::<_, ConfigError>(Endpoint {
                true_addr,
                external_prefix: prefix.as_ref().map(|s| prefix64(src, s)).transpose()?,
                mac: mac_text.as_ref().map(|s| mac(src, s)).transpose()?,
            })
        };
    let local = endpoint(draft.local_true, &p.local_prefix, &p.local_mac)?;
    let remote = endpoint(draft.remote_true, &p.remote_prefix, &p.remote_mac)?;
    Ok(draft.settings.stream(local, remote, key))
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
