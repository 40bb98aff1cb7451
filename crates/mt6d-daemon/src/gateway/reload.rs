//! Live configuration: SIGHUP, `mt6d reload` and `mt6d peer add|remove|set` change the running
//! peers through this one path, all or nothing, without touching the peers that stay the same.
//!
//! Where a proposed configuration comes from:
//! - SIGHUP and the control socket's `reload` re-read the file ([`reload_file`]);
//! - the control socket's peer edits ([`edit`]) are made to the TOML document the running
//!   configuration was validated from ([`Live::doc`]), and the edited document is validated as
//!   a whole by the same parser as the file ([`Config::parse`]): a peer added live is checked
//!   against every other peer exactly as if it had been written in the file. Edits are
//!   runtime-only: the file is never written, so a later SIGHUP or `mt6d reload` makes the
//!   daemon match the file again (as `wg set` against `wg syncconf`).
//!
//! Then ([`commit`]), in order (fail closed, nothing half-applied):
//! 1. An invalid proposal is refused whole, with what is wrong: file:line:column for the file,
//!    the peer and its `key = value` for an edit. A changed `[gateway]` or `[tcp]` setting
//!    refuses the whole change, naming the keys (interfaces, the TUN device and the node's own
//!    settings are set up once: a restart applies them; `[gateway]`'s stream settings are the
//!    peers' defaults and change peers), and so does an added peer whose tunnel overhead the
//!    TUN MTU has no room for.
//! 2. The new peers are built (keys, counter reservations) and checked against the other
//!    daemons of the namespace; nothing in the kernel has changed yet.
//! 3. Their kernel state is made: guards first, then the nftables table, routes and proxy
//!    entries ([`System::add_peers`]); a failure undoes exactly that and keeps the old set.
//! 4. The rotator binds their hashed addresses and sockets and publishes one new table that
//!    carries the new peer set ([`super::routing`]): from that pointer swap on, the packet
//!    threads see the new set, and never an index of one set against the other's table.
//! 5. Only then goes what only removed peers used: their hashed addresses, sockets and
//!    neighbour entries (by the rotator, right after the swap), then routes, proxy entries,
//!    and their guards last ([`System::remove_peers`]), each taken off the instance record.
//!
//! A peer kept as it was is the same `Arc<Peer>` in the new set: its keys, replay window,
//! counters and handshake carry over, and its packets never stop. A changed peer is removed and
//! added: its session restarts. Peers are matched by name through maps, so a change costs one
//! validation of the whole configuration (each peer's stream built once) and work linear in
//! the number of peers, whatever the number of peers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{Config, ConfigError, PeerConfig};
use crate::control::Edit;

use super::build_peer;
use super::error::GatewayError;
use super::peer::Peer;
use super::polls::Polls;
use super::rotation::Rotator;
use super::shared::Shared;
use super::state::error_chain;
use super::system::System;
use crate::daemon::clock;

/// The running configuration, and the TOML document it was validated from (the file's, with
/// the live edits made since).
#[derive(Debug, Clone)]
pub struct Live {
    pub cfg: Config,
    pub doc: toml::Table,
}

/// What a change did to the peer set, by name.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

/// Why a proposed change was refused. Whatever the variant, nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// The proposed configuration is invalid; the message names where (file:line:column, or
    /// the peer and its `key = value`).
    #[error("{0}")]
    Invalid(String),
    /// The node's own settings changed (the keys named): a restart applies them.
    #[error("{} is valid but its [gateway] settings changed ({}); nothing applied (interfaces, the TUN device and the node's own settings are set up at start: a restart applies them)", .path.display(), .keys.join(", "))]
    GatewayChanged {
        path: PathBuf,
        keys: Vec<&'static str>,
    },
    #[error("no peer named {0:?} is running")]
    NoSuchPeer(String),
    #[error("a peer named {0:?} is already running (`mt6d peer set` changes it)")]
    PeerExists(String),
    /// An edit that cannot be made as asked.
    #[error("{0}")]
    Request(String),
    /// Valid, but the kernel or a key refused it; what was made for it is undone.
    #[error("{}", error_chain(.0))]
    Apply(GatewayError),
}

impl Plan {
    /// Compares two valid configurations' peers. A peer is the same when its stream settings,
    /// keying and key are (the key compared through a digest, never printed).
    pub fn between(old: &Config, new: &Config) -> Plan {
        let fingerprint = |p: &PeerConfig| {
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(p.stream.key.as_bytes());
            format!("{:?} {:?} {:?} {digest:x}", p.stream, p.keying, p.host_id)
        };
        let old_by_name: HashMap<&str, &PeerConfig> =
            old.peers.iter().map(|p| (p.name.as_str(), p)).collect();
        let mut plan = Plan::default();
        for p in &new.peers {
            match old_by_name.get(p.name.as_str()) {
                None => plan.added.push(p.name.clone()),
                Some(o) if fingerprint(o) != fingerprint(p) => plan.changed.push(p.name.clone()),
                Some(_) => {}
            }
        }
        let new_names: std::collections::HashSet<&str> =
            new.peers.iter().map(|p| p.name.as_str()).collect();
        for o in &old.peers {
            if !new_names.contains(o.name.as_str()) {
                plan.removed.push(o.name.clone());
            }
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// The names of the peers that leave the running set (removed, or changed: the old one
    /// goes).
    fn drops(&self) -> std::collections::HashSet<&str> {
        self.removed
            .iter()
            .chain(&self.changed)
            .map(String::as_str)
            .collect()
    }

    /// The names of the peers of the new configuration that are new (added, or changed).
    fn brings(&self) -> std::collections::HashSet<&str> {
        self.added
            .iter()
            .chain(&self.changed)
            .map(String::as_str)
            .collect()
    }
}

/// What the daemon's main thread hands a change.
#[derive(Debug)]
pub struct Running<'a> {
    pub live: &'a mut Live,
    pub sys: &'a mut System,
    pub rotator: &'a mut Rotator,
    pub polls: &'a Polls,
    pub shared: &'a Shared,
}

/// SIGHUP and `mt6d reload`: the file as it is now becomes the running configuration. `by`
/// names the cause in the log lines ("SIGHUP").
pub fn reload_file(run: Running<'_>, by: &str) -> Result<Plan, ChangeError> {
    let path = run.live.cfg.path.clone();
    let (new, doc) = Config::load_document(&path).map_err(|e| {
        log::error!("{by}: {e}; keeping the running configuration unchanged");
        ChangeError::Invalid(e.to_string())
    })?;
    let plan = commit(run, new, doc, by)?;
    if plan.is_empty() {
        log::info!(
            "{by}: {} is valid and the same as the running configuration",
            path.display()
        );
    }
    Ok(plan)
}

/// `mt6d peer add|remove|set`: `edits` made together to the running document, validated as a
/// whole, applied all or nothing.
pub fn edit(run: Running<'_>, edits: &[Edit], by: &str) -> Result<Plan, ChangeError> {
    let proposed = edited(&run.live.doc, edits).and_then(|doc| {
        let text = toml::to_string(&doc)
            .map_err(|e| ChangeError::Request(format!("cannot write the edited peers: {e}")))?;
        // The file's path: relative key files of the file's peers resolve as they did.
        Config::parse(&run.live.cfg.path, &text)
            .map(|cfg| (cfg, doc.clone()))
            .map_err(|e| explain(&text, &doc, e))
    });
    let (new, doc) = proposed.inspect_err(|e| {
        log::warn!("{by}: refused, nothing changed: {e}");
    })?;
    commit(run, new, doc, by)
}

/// Makes `edits` to a copy of `doc`, in order.
fn edited(doc: &toml::Table, edits: &[Edit]) -> Result<toml::Table, ChangeError> {
    let mut doc = doc.clone();
    let peers = match doc
        .entry("peer")
        .or_insert_with(|| toml::Value::Array(Vec::new()))
    {
        toml::Value::Array(a) => a,
        _ => {
            return Err(ChangeError::Request(
                "`peer` is not a list of tables".into(),
            ))
        }
    };
    let name_of = |v: &toml::Value| {
        v.get("name")
            .and_then(toml::Value::as_str)
            .map(str::to_owned)
    };
    let index = |peers: &[toml::Value], name: &str| {
        peers
            .iter()
            .position(|p| name_of(p).as_deref() == Some(name))
            .ok_or_else(|| ChangeError::NoSuchPeer(name.to_owned()))
    };
    for e in edits {
        match e {
            Edit::Add { peer } => {
                let Some(name) = peer.get("name").and_then(toml::Value::as_str) else {
                    return Err(ChangeError::Request(
                        "peer add: the peer has no name".into(),
                    ));
                };
                if index(peers, name).is_ok() {
                    return Err(ChangeError::PeerExists(name.to_owned()));
                }
                peers.push(toml::Value::Table(peer.clone()));
            }
            Edit::Set {
                name,
                fields,
                unset,
            } => {
                if fields.contains_key("name") || unset.iter().any(|k| k == "name") {
                    return Err(ChangeError::Request(format!(
                        "peer set {name:?}: a peer's name cannot change (remove it and add it under the new name)"
                    )));
                }
                let i = index(peers, name)?;
                let Some(table) = peers[i].as_table_mut() else {
                    return Err(ChangeError::Request(format!(
                        "peer {name:?} is not a table"
                    )));
                };
                for key in unset {
                    if table.remove(key).is_none() {
                        return Err(ChangeError::Request(format!(
                            "peer set {name:?}: --unset {key}: the peer has no {key}"
                        )));
                    }
                }
                for (k, v) in fields {
                    table.insert(k.clone(), v.clone());
                }
            }
            Edit::Remove { name } => {
                let i = index(peers, name)?;
                peers.remove(i);
            }
        }
    }
    Ok(doc)
}

/// Turns the parser's error about the edited document, whose lines exist nowhere a person can
/// open, into one that names the peer and the `key = value` at fault.
fn explain(text: &str, doc: &toml::Table, e: ConfigError) -> ChangeError {
    match e {
        ConfigError::At { line, message, .. } => {
            let lines: Vec<&str> = text.lines().collect();
            let at = lines.get(line.saturating_sub(1)).map_or("", |l| l.trim());
            // Which table the line is in: the n-th `[[peer]]` above it, or `[gateway]`.
            let n = lines
                .iter()
                .take(line)
                .filter(|l| l.trim() == "[[peer]]")
                .count();
            let owner = match n.checked_sub(1).and_then(|i| {
                doc.get("peer")
                    .and_then(toml::Value::as_array)
                    .and_then(|a| a.get(i))
            }) {
                Some(p) => match p.get("name").and_then(toml::Value::as_str) {
                    Some(name) => format!("peer {name:?}"),
                    None => format!("peer #{n}"),
                },
                None => "[gateway]".to_owned(),
            };
            // Never echo an inline secret.
            let shown = if at.starts_with("key ") || at.starts_with("key=") {
                "key = (secret)"
            } else {
                at
            };
            if shown.is_empty() || shown.starts_with('[') {
                ChangeError::Invalid(format!("{owner}: {message}"))
            } else {
                ChangeError::Invalid(format!("{owner}: `{shown}`: {message}"))
            }
        }
        ConfigError::File { message, .. } => ChangeError::Invalid(message),
        other => ChangeError::Invalid(other.to_string()),
    }
}

/// The refusal of a proposal whose node settings (`[gateway]`, `[tcp]`) differ from the
/// running ones, naming the keys; None when only peers changed.
fn gateway_changed(old: &Config, new: &Config) -> Option<ChangeError> {
    let keys = old.gateway.changed_keys(&new.gateway);
    (!keys.is_empty()).then(|| ChangeError::GatewayChanged {
        path: old.path.clone(),
        keys,
    })
}

/// The one way a valid proposal becomes the running configuration.
fn commit(run: Running<'_>, new: Config, doc: toml::Table, by: &str) -> Result<Plan, ChangeError> {
    let path = run.live.cfg.path.clone();
    if let Some(e) = gateway_changed(&run.live.cfg, &new) {
        log::warn!("{by}: {e}");
        return Err(e);
    }
    let plan = Plan::between(&run.live.cfg, &new);
    if plan.is_empty() {
        run.live.doc = doc;
        return Ok(plan);
    }
    let live = &mut *run.live;
    let result = apply(
        Applying {
            cfg: &mut live.cfg,
            sys: run.sys,
            rotator: run.rotator,
            polls: run.polls,
            shared: run.shared,
        },
        new,
        &plan,
        by,
    );
    match result {
        Ok(()) => {
            live.doc = doc;
            Ok(plan)
        }
        Err(e) => {
            log::error!(
                "{by}: {}: {}; nothing applied, the running peers are unchanged",
                path.display(),
                error_chain(&e)
            );
            Err(ChangeError::Apply(e))
        }
    }
}

struct Applying<'a> {
    cfg: &'a mut Config,
    sys: &'a mut System,
    rotator: &'a mut Rotator,
    polls: &'a Polls,
    shared: &'a Shared,
}

fn apply(run: Applying<'_>, new: Config, plan: &Plan, by: &str) -> Result<(), GatewayError> {
    let Applying {
        cfg,
        sys,
        rotator,
        polls,
        shared,
    } = run;
    let brings = plan.brings();
    let drops = plan.drops();
    // Built before anything changes: keys, handshakes and counter reservations.
    let mut built: HashMap<&str, Arc<Peer>> = HashMap::new();
    for p in new
        .peers
        .iter()
        .filter(|p| brings.contains(p.name.as_str()))
    {
        let (peer, overhead) = build_peer(&new, p)?;
        if overhead > sys.max_overhead {
            return Err(GatewayError::Setup(format!(
                "peer {:?} needs {overhead} bytes of tunnel overhead, the TUN MTU {} leaves room for {}: a restart applies it",
                p.name, sys.tun_mtu, sys.max_overhead
            )));
        }
        built.insert(p.name.as_str(), peer);
    }
    let added: Vec<&PeerConfig> = new
        .peers
        .iter()
        .filter(|p| brings.contains(p.name.as_str()))
        .collect();
    let old: Vec<&PeerConfig> = cfg.peers.iter().collect();
    sys.admit_peers(&added)?;
    // Write-ahead: other starts see the added peers as ours before the kernel does.
    let union: Vec<&PeerConfig> = old.iter().chain(&added).copied().collect();
    sys.record_peers(&union)?;
    if let Err(e) = sys.add_peers(cfg, &old, &added) {
        let _ = sys.record_peers(&old);
        return Err(e);
    }

    // The new set in the new configuration's order: kept peers are the running `Arc`s.
    let old_set = rotator.peers().to_vec();
    let running: HashMap<&str, &Arc<Peer>> = old_set.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut set = Vec::with_capacity(new.peers.len());
    for p in &new.peers {
        let peer = if brings.contains(p.name.as_str()) {
            built.get(p.name.as_str()).cloned()
        } else {
            running.get(p.name.as_str()).map(|a| Arc::clone(a))
        };
        set.push(peer.ok_or_else(|| {
            GatewayError::Setup(format!("peer {:?} missing from the running set", p.name))
        })?);
    }
    rotator.set_peers(set);
    if let Err(e) = rotator.step(&mut sys.netlink, polls, shared, clock::now()) {
        // Nothing was published: back to the running set, and its kernel state only.
        rotator.set_peers(old_set);
        if let Err(again) = rotator.step(&mut sys.netlink, polls, shared, clock::now()) {
            log::error!("{by} roll-back: {again}");
        }
        sys.remove_peers(cfg, &added);
        let _ = sys.record_peers(&old);
        return Err(e);
    }
    let removed: Vec<&PeerConfig> = cfg
        .peers
        .iter()
        .filter(|p| drops.contains(p.name.as_str()))
        .collect();
    sys.remove_peers(&new, &removed);
    let now: Vec<&PeerConfig> = new.peers.iter().collect();
    if let Err(e) = sys.record_peers(&now) {
        log::error!("{by}: {e}");
    }
    for name in &plan.removed {
        log::info!("{by}: peer {name:?} removed: its routes, guard and hashed addresses are gone");
    }
    for name in &plan.changed {
        log::info!("{by}: peer {name:?} changed: removed and added again, its session restarts");
    }
    let added_names: std::collections::HashSet<&str> =
        plan.added.iter().map(String::as_str).collect();
    for p in new
        .peers
        .iter()
        .filter(|p| added_names.contains(p.name.as_str()))
    {
        log::info!(
            "{by}: peer {:?} added ({} <-> {}, {})",
            p.name,
            p.stream.local.true_addr,
            p.stream.remote.true_addr,
            p.stream.mode
        );
    }
    *cfg = new;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// One key per peer: two peers of one host with the same key are refused (linkable).
    const KEYS: [&str; 6] = [
        "JSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QEFCQ0Q=",
        "SktMTU5PUFFSU1RVVldYWVpbXF1eX2BhYmNkZWZnaGk=",
        "b3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY4=",
        "lJWWl5iZmpucnZ6foKGio6SlpqeoqaqrrK2ur7CxsrM=",
        "ubq7vL2+v8DBwsPExcbHyMnKy8zNzs/Q0dLT1NXW19g=",
        "3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P0=",
    ];

    fn config(peers: &[(&str, &str, &str)]) -> Config {
        let mut text = String::from(
            "[gateway]\ninternal_interface = \"eth1\"\nexternal_interface = \"eth0\"\nrotation_secs = 1\n",
        );
        for (name, remote, key) in peers {
            text.push_str(&format!(
                "\n[[peer]]\nname = \"{name}\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"{remote}\"\nkey = \"{key}\"\n"
            ));
        }
        Config::parse(Path::new("/etc/mt6d/gw.toml"), &text).expect("valid")
    }

    #[test]
    fn plan_names_added_removed_and_changed_peers_and_keeps_the_rest() {
        let old = config(&[
            ("kept", "2001:db8:1::b", KEYS[0]),
            ("gone", "2001:db8:1::c", KEYS[1]),
            ("rekeyed", "2001:db8:1::d", KEYS[2]),
            ("moved", "2001:db8:1::e", KEYS[3]),
        ]);
        let new = config(&[
            ("kept", "2001:db8:1::b", KEYS[0]),
            ("rekeyed", "2001:db8:1::d", KEYS[4]),
            ("moved", "2001:db8:1::f", KEYS[3]),
            ("new", "2001:db8:1::9", KEYS[5]),
        ]);
        let plan = Plan::between(&old, &new);
        assert_eq!(plan.added, ["new"]);
        assert_eq!(plan.removed, ["gone"]);
        assert_eq!(
            plan.changed,
            ["rekeyed", "moved"],
            "a new key or address changes a peer"
        );
        assert!(!plan.drops().contains("kept") && !plan.brings().contains("kept"));
        assert!(plan.drops().contains("rekeyed") && plan.brings().contains("rekeyed"));
        assert!(Plan::between(&old, &old).is_empty());
    }

    /// A reload that changes one `[gateway]` key is refused and the refusal names the key; one
    /// that changes a stream default of `[gateway]` (inherited by the peers) or a peer is not:
    /// the peers it changes are applied live. As when the comparison was of the printed forms,
    /// now field by field.
    #[test]
    fn a_changed_gateway_key_is_refused_by_name_and_a_changed_peer_is_not() {
        let old = config(&[("b", "2001:db8:1::b", KEYS[0])]);
        let with = |from: &str, to: &str| {
            let text = format!(
                "[gateway]\ninternal_interface = \"eth1\"\nexternal_interface = \"eth0\"\nrotation_secs = 1\n\n[[peer]]\nname = \"b\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"2001:db8:1::b\"\nkey = \"{}\"\n",
                KEYS[0]
            )
            .replacen(from, to, 1);
            Config::parse(Path::new("/etc/mt6d/gw.toml"), &text).expect("valid")
        };
        assert!(gateway_changed(&old, &with("", "")).is_none());
        for (from, to, key) in [
            // The default control socket is named after the TUN device: both change.
            (
                "rotation_secs = 1\n",
                "rotation_secs = 1\ntun_name = \"mt6d7\"\n",
                "tun_name, control_socket",
            ),
            ("\"eth1\"", "\"eth2\"", "internal_interface"),
            (
                "rotation_secs = 1\n",
                "rotation_secs = 1\nworkers = 2\n",
                "workers",
            ),
            (
                "rotation_secs = 1\n",
                "rotation_secs = 1\nlog_level = \"debug\"\n",
                "log_level",
            ),
            (
                "rotation_secs = 1\n",
                "rotation_secs = 1\n[tcp]\nmss_clamp = false\n",
                "[tcp]",
            ),
        ] {
            let new = with(from, to);
            let e = gateway_changed(&old, &new).expect("refused").to_string();
            assert!(
                e.contains(&format!("[gateway] settings changed ({key})")),
                "{key}: {e}"
            );
            assert_ne!(old.gateway, new.gateway, "{key}");
        }
        // A stream default of [gateway] changes the peers, which a reload applies live.
        let faster = with("rotation_secs = 1\n", "rotation_secs = 2\n");
        assert!(gateway_changed(&old, &faster).is_none());
        assert_eq!(Plan::between(&old, &faster).changed, ["b"]);
    }

    /// What `edit` validates, without a daemon: the edited document parsed as the file is.
    fn propose(old: &Config, edits: &[Edit]) -> Result<Config, ChangeError> {
        let doc: toml::Table = toml::to_string(&raw_doc(old))
            .expect("doc")
            .parse()
            .expect("table");
        let new = edited(&doc, edits)?;
        let text = toml::to_string(&new).expect("writes");
        Config::parse(&old.path, &text).map_err(|e| explain(&text, &new, e))
    }

    /// The document of [`config`]'s text (what `Live::doc` holds for a file).
    fn raw_doc(cfg: &Config) -> toml::Table {
        let mut text = String::from(
            "[gateway]\ninternal_interface = \"eth1\"\nexternal_interface = \"eth0\"\nrotation_secs = 1\n",
        );
        for (p, key) in cfg.peers.iter().zip(KEYS) {
            text.push_str(&format!(
                "\n[[peer]]\nname = \"{}\"\nlocal_host = \"{}\"\nremote_host = \"{}\"\nkey = \"{key}\"\n",
                p.name, p.stream.local.true_addr, p.stream.remote.true_addr
            ));
        }
        text.parse().expect("table")
    }

    fn peer(name: &str, remote: &str, key: &str) -> toml::Table {
        format!("name = \"{name}\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"{remote}\"\nkey = \"{key}\"\n")
            .parse()
            .expect("table")
    }

    /// A live edit is validated with every running peer, as the file is, and an error names the
    /// peer and the setting at fault, never an inline key.
    #[test]
    fn edits_are_validated_like_the_file_and_errors_name_the_peer_and_setting() {
        let old = config(&[
            ("b", "2001:db8:1::b", KEYS[0]),
            ("c", "2001:db8:1::c", KEYS[1]),
        ]);
        let added = propose(
            &old,
            &[Edit::Add {
                peer: peer("d", "2001:db8:1::d", KEYS[2]),
            }],
        )
        .expect("a valid peer is accepted");
        assert_eq!(Plan::between(&old, &added).added, ["d"]);

        let bad = propose(
            &old,
            &[Edit::Add {
                peer: peer("d", "2001:db8:1::zz", KEYS[2]),
            }],
        )
        .expect_err("a bad address is refused")
        .to_string();
        assert!(
            bad.starts_with("peer \"d\": `remote_host = \"2001:db8:1::zz\"`:")
                && bad.contains("not an IPv6 address"),
            "{bad}"
        );
        // Checked against the running peers: the same conversation twice is refused.
        let twice = propose(
            &old,
            &[Edit::Add {
                peer: peer("d", "2001:db8:1::b", KEYS[2]),
            }],
        )
        .expect_err("a second peer for b's conversation")
        .to_string();
        assert!(twice.starts_with("peer \"d\""), "{twice}");
        let mut unknown = peer("d", "2001:db8:1::d", KEYS[2]);
        unknown.insert("colour".into(), toml::Value::String("red".into()));
        let e = propose(&old, &[Edit::Add { peer: unknown }])
            .expect_err("an unknown key")
            .to_string();
        assert!(e.contains("peer \"d\"") && e.contains("colour"), "{e}");
        // A bad inline key is named without its value.
        let e = propose(
            &old,
            &[Edit::Set {
                name: "c".into(),
                fields: [(
                    "key".to_string(),
                    toml::Value::String("bm90IGEga2V5".into()),
                )]
                .into_iter()
                .collect(),
                unset: vec![],
            }],
        )
        .expect_err("a short key")
        .to_string();
        assert!(e.starts_with("peer \"c\": `key = (secret)`"), "{e}");
        assert!(!e.contains("bm90IGEga2V5"), "{e}");

        assert!(matches!(
            propose(&old, &[Edit::Add { peer: peer("b", "2001:db8:1::d", KEYS[2]) }]),
            Err(ChangeError::PeerExists(n)) if n == "b"
        ));
        assert!(matches!(
            propose(&old, &[Edit::Remove { name: "x".into() }]),
            Err(ChangeError::NoSuchPeer(n)) if n == "x"
        ));
        let e = propose(
            &old,
            &[
                Edit::Remove { name: "b".into() },
                Edit::Remove { name: "c".into() },
            ],
        )
        .expect_err("no peer left")
        .to_string();
        assert!(e.contains("at least one peer"), "{e}");
        // All or nothing within a request: a valid removal with an invalid addition is refused.
        assert!(propose(
            &old,
            &[
                Edit::Remove { name: "b".into() },
                Edit::Add {
                    peer: peer("d", "nowhere", KEYS[2])
                }
            ],
        )
        .is_err());
        // A mode that sends the payload in clear needs the file's acknowledgement.
        let clear = propose(
            &old,
            &[Edit::Set {
                name: "c".into(),
                fields: [("mode".to_string(), toml::Value::String("auth".into()))]
                    .into_iter()
                    .collect(),
                unset: vec![],
            }],
        )
        .expect_err("auth without accept_clear_payload")
        .to_string();
        assert!(clear.contains("accept_clear_payload"), "{clear}");
        let set = propose(
            &old,
            &[Edit::Set {
                name: "c".into(),
                fields: [("rotation_secs".to_string(), toml::Value::Float(2.0))]
                    .into_iter()
                    .collect(),
                unset: vec![],
            }],
        )
        .expect("rotation change");
        let plan = Plan::between(&old, &set);
        assert_eq!(
            (plan.changed.as_slice(), plan.added.len()),
            (&["c".to_string()][..], 0)
        );
        assert!(matches!(
            propose(
                &old,
                &[Edit::Set {
                    name: "c".into(),
                    fields: toml::Table::new(),
                    unset: vec!["name".into()]
                }]
            ),
            Err(ChangeError::Request(_))
        ));
    }
}
