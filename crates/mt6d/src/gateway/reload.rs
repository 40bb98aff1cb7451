//! SIGHUP: re-reads the configuration file and applies what changed in its peers, all or
//! nothing, without touching the peers that stayed the same.
//!
//! Order (fail closed, nothing half-applied):
//! 1. The whole file is validated ([`Config::load`]); an invalid one is logged with
//!    file:line:column and nothing changes. A changed `[gateway]` section refuses the whole
//!    reload (interfaces, mode and the TUN device are set up once: a restart applies them), and
//!    so does an added peer whose tunnel overhead the TUN MTU has no room for.
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
//! added: its session restarts.

use std::sync::Arc;

use mt6d_os::Epoll;

use crate::config::{Config, PeerConfig};

use super::error::GatewayError;
use super::peer::Peer;
use super::rotation::Rotator;
use super::shared::Shared;
use super::state::error_chain;
use super::system::System;
use super::{build_peer, clock};

/// What a reload changes in the peer set, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
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
        let mut plan = Plan::default();
        for p in &new.peers {
            match old.peers.iter().find(|o| o.name == p.name) {
                None => plan.added.push(p.name.clone()),
                Some(o) if fingerprint(o) != fingerprint(p) => plan.changed.push(p.name.clone()),
                Some(_) => {}
            }
        }
        for o in &old.peers {
            if !new.peers.iter().any(|p| p.name == o.name) {
                plan.removed.push(o.name.clone());
            }
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// Whether peer `name` leaves the running set (removed, or changed: the old one goes).
    fn drops(&self, name: &str) -> bool {
        self.removed.iter().chain(&self.changed).any(|n| n == name)
    }

    /// Whether peer `name` of the new configuration is new (added, or changed).
    fn brings(&self, name: &str) -> bool {
        self.added.iter().chain(&self.changed).any(|n| n == name)
    }
}

/// What the daemon's main thread hands a reload.
#[derive(Debug)]
pub struct Running<'a> {
    pub cfg: &'a mut Config,
    pub sys: &'a mut System,
    pub rotator: &'a mut Rotator,
    pub epoll: &'a Epoll,
    pub shared: &'a Shared,
}

/// SIGHUP. Returns true if the peer set changed (the rotation schedule may have too).
pub fn reload(run: Running<'_>) -> bool {
    let path = run.cfg.path.clone();
    let new = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            log::error!("SIGHUP: {e}; keeping the running configuration unchanged");
            return false;
        }
    };
    if format!("{:?}", run.cfg.gateway) != format!("{:?}", new.gateway) {
        log::warn!(
            "SIGHUP: {} is valid but its [gateway] settings changed; nothing applied (interfaces, mode and the TUN device need a restart)",
            path.display()
        );
        return false;
    }
    let plan = Plan::between(run.cfg, &new);
    if plan.is_empty() {
        log::info!(
            "SIGHUP: {} is valid and the same as the running configuration",
            path.display()
        );
        return false;
    }
    match apply(run, new, &plan) {
        Ok(()) => true,
        Err(e) => {
            log::error!(
                "SIGHUP: {}: {}; nothing applied, the running peers are unchanged",
                path.display(),
                error_chain(&e)
            );
            false
        }
    }
}

fn apply(run: Running<'_>, new: Config, plan: &Plan) -> Result<(), GatewayError> {
    let Running {
        cfg,
        sys,
        rotator,
        epoll,
        shared,
    } = run;
    // Built before anything changes: keys, handshakes and counter reservations.
    let mut built: Vec<(String, Arc<Peer>)> = Vec::new();
    for p in new.peers.iter().filter(|p| plan.brings(&p.name)) {
        let (peer, overhead) = build_peer(&new, p)?;
        if overhead > sys.max_overhead {
            return Err(GatewayError::Setup(format!(
                "peer {:?} needs {overhead} bytes of tunnel overhead, the TUN MTU {} leaves room for {}: a restart applies it",
                p.name, sys.tun_mtu, sys.max_overhead
            )));
        }
        built.push((p.name.clone(), peer));
    }
    let added: Vec<&PeerConfig> = new.peers.iter().filter(|p| plan.brings(&p.name)).collect();
    let old: Vec<&PeerConfig> = cfg.peers.iter().collect();
    sys.admit_peers(&added)?;
    // Write-ahead: other starts see the added peers as ours before the kernel does.
    let union: Vec<&PeerConfig> = old.iter().chain(&added).copied().collect();
    sys.record_peers(&union)?;
    if let Err(e) = sys.add_peers(cfg, &old, &added) {
        let _ = sys.record_peers(&old);
        return Err(e);
    }

    // The new set in the new file's order: kept peers are the running `Arc`s.
    let old_set = rotator.peers().to_vec();
    let mut set = Vec::with_capacity(new.peers.len());
    for p in &new.peers {
        let peer = if plan.brings(&p.name) {
            built
                .iter()
                .find(|(n, _)| *n == p.name)
                .map(|(_, b)| b.clone())
        } else {
            old_set.iter().find(|o| o.name == p.name).cloned()
        };
        set.push(peer.ok_or_else(|| {
            GatewayError::Setup(format!("peer {:?} missing from the running set", p.name))
        })?);
    }
    rotator.set_peers(set);
    if let Err(e) = rotator.step(&mut sys.netlink, epoll, shared, clock::now()) {
        // Nothing was published: back to the running set, and its kernel state only.
        rotator.set_peers(old_set);
        if let Err(again) = rotator.step(&mut sys.netlink, epoll, shared, clock::now()) {
            log::error!("SIGHUP roll-back: {again}");
        }
        sys.remove_peers(cfg, &added);
        let _ = sys.record_peers(&old);
        return Err(e);
    }
    let removed: Vec<&PeerConfig> = cfg.peers.iter().filter(|p| plan.drops(&p.name)).collect();
    sys.remove_peers(&new, &removed);
    let now: Vec<&PeerConfig> = new.peers.iter().collect();
    if let Err(e) = sys.record_peers(&now) {
        log::error!("SIGHUP: {e}");
    }
    for name in &plan.removed {
        log::info!(
            "SIGHUP: peer {name:?} removed: its routes, guard and hashed addresses are gone"
        );
    }
    for name in &plan.changed {
        log::info!("SIGHUP: peer {name:?} changed: removed and added again, its session restarts");
    }
    for p in new.peers.iter().filter(|p| plan.added.contains(&p.name)) {
        log::info!(
            "SIGHUP: peer {:?} added ({} <-> {}, {})",
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
        assert!(!plan.drops("kept") && !plan.brings("kept"));
        assert!(plan.drops("rekeyed") && plan.brings("rekeyed"));
        assert!(Plan::between(&old, &old).is_empty());
    }
}
