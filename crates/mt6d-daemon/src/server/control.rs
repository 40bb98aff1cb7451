//! The server role's control socket (docs/CONFIG.md "The server role"): `mt6d status`, `mt6d
//! reload` and `mt6d peer add|remove` for a running server, as for a gateway.
//!
//! A client added here is validated exactly as a peers-file line is (the options are put
//! together into one line and parsed by the same parser, then checked with every other client),
//! and a request applies all its edits or none. Runtime only: the peers file is not written, so
//! the next reload or restart returns to it.

use std::collections::HashSet;
use std::time::Instant;

use zeroize::Zeroizing;

use super::shared::Shared;
use crate::config::{ClientConfig, ServerConfig};
use crate::control::{Asked, ChangeAnswer, ControlServer, Edit, Request};
use crate::daemon::clock;
use crate::status::server::ServerStatus;

/// Answers every request waiting on `ctl`.
pub fn serve(ctl: &ControlServer, cfg: &ServerConfig, shared: &Shared, started: Instant) {
    while let Some(pending) = ctl.next_request() {
        match pending.request.clone() {
            Asked::Status => pending.reply(&status(cfg, shared, started)),
            Asked::Change(Request::Reload) => pending.reply(&super::reload(cfg, shared)),
            Asked::Change(Request::Peers { edits }) => {
                let answer = apply(cfg, shared, &edits);
                match &answer.error {
                    Some(e) => log::warn!("control socket: peer change refused: {e}"),
                    None => log::info!(
                        "control socket: clients added [{}], removed [{}] (runtime only, the peers file is unchanged)",
                        answer.added.join(", "),
                        answer.removed.join(", ")
                    ),
                }
                pending.reply(&answer);
            }
            Asked::Unknown(why) => pending.reply(&refused(why)),
        }
    }
}

fn refused(message: String) -> ChangeAnswer {
    ChangeAnswer {
        error: Some(message),
        ..ChangeAnswer::default()
    }
}

pub(super) fn status(cfg: &ServerConfig, shared: &Shared, started: Instant) -> ServerStatus {
    let (clients, (sessions, sets)) = {
        let reg = shared.registry.read();
        (reg.len() as u64, reg.session_counts())
    };
    ServerStatus {
        role: "server".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        uptime_secs: started.elapsed().as_secs(),
        config: cfg.path.display().to_string(),
        prefix: cfg.prefix.to_string(),
        tun: cfg.tun_name.clone(),
        clients,
        sessions,
        session_route_sets: sets as u64,
        counters: shared
            .counters
            .snapshot()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        workers: shared
            .load
            .iter()
            .map(crate::daemon::worker::WorkerLoad::status)
            .collect(),
    }
}

/// The peers-file line (docs/CONFIG.md "Peers file") an `add` stands for. Options: `name`,
/// `public_key`, `remote_host` (the client's true address), and optionally `remote_prefix`
/// (its hashed /64), `key_file` (a pre-shared session key: no handshakes) and
/// `preshared_key_file`. Key files are read here, by the daemon; the client command made their
/// paths absolute.
fn line_of(peer: &toml::Table) -> Result<Zeroizing<String>, String> {
    const KNOWN: [&str; 6] = [
        "name",
        "public_key",
        "remote_host",
        "remote_prefix",
        "key_file",
        "preshared_key_file",
    ];
    if let Some(k) = peer.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!(
            "a server's client takes {} only; {k} is a gateway peer's setting (the server's own side comes from its [server] table)",
            KNOWN.join(", ")
        ));
    }
    let text = |k: &str| -> Result<Option<&str>, String> {
        match peer.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(format!("{k} must be a string, not {}", other.type_str())),
        }
    };
    let need = |k: &str| -> Result<&str, String> {
        text(k)?.ok_or_else(|| format!("a client needs {k} (--{})", k.replace('_', "-")))
    };
    let secret = |k: &str| -> Result<Option<Zeroizing<String>>, String> {
        text(k)?
            .map(|p| {
                crate::keys::read_secret_file(std::path::Path::new(p))
                    .map(|t| Zeroizing::new(t.trim().to_string()))
                    .map_err(|e| format!("{k}: {e}"))
            })
            .transpose()
    };
    let (name, public, host) = (need("name")?, need("public_key")?, need("remote_host")?);
    if public.is_empty() {
        return Err("public_key is empty".into());
    }
    let mut line = Zeroizing::new(format!("{name} {public} {host}"));
    if let Some(psk) = secret("preshared_key_file")? {
        line.push(' ');
        line.push_str(&psk);
    }
    if let Some(p) = text("remote_prefix")? {
        line.push_str(" prefix=");
        line.push_str(p);
    }
    if let Some(k) = secret("key_file")? {
        line.push_str(" key=");
        line.push_str(&k);
    }
    Ok(line)
}

/// Applies `edits` all together, or none of them.
fn apply(cfg: &ServerConfig, shared: &Shared, edits: &[Edit]) -> ChangeAnswer {
    let mut lines = Zeroizing::new(String::new());
    let mut removed: Vec<String> = Vec::new();
    for e in edits {
        match e {
            Edit::Add { peer } => match line_of(peer) {
                Ok(l) => {
                    lines.push_str(&l);
                    lines.push('\n');
                }
                Err(why) => return refused(format!("add: {why}")),
            },
            Edit::Remove { name } => removed.push(name.clone()),
            Edit::Set { name, .. } => {
                return refused(format!(
                    "peer set {name}: a server's client is changed by removing and adding it (mt6d peer remove {name}; mt6d peer add {name} ...), or in the peers file and a reload"
                ))
            }
        }
    }
    let entries = match mt6d_proto::peers_file::parse(&lines) {
        Ok(e) => e,
        Err(e) => return refused(format!("add: {e} (counting the added clients from 1)")),
    };
    let added: Vec<ClientConfig> = match cfg.clients_from(&entries) {
        Ok(c) => c,
        Err(e) => return refused(format!("add: {e} (counting the added clients from 1)")),
    };
    // Checked under the read lock (the clash check scans every client; workers keep reading
    // meanwhile): only this thread, the main one, adds or removes clients, so nothing checked
    // here changes before the write lock below is taken.
    let reg = shared.registry.read();
    let mut gone = HashSet::new();
    for name in &removed {
        if reg.id_of(name).is_none() {
            return refused(format!("remove: no client {name:?}"));
        }
        if !gone.insert(name.as_str()) {
            return refused(format!("remove: {name:?} named twice"));
        }
    }
    for c in &added {
        if reg.id_of(&c.name).is_some() && !gone.contains(c.name.as_str()) {
            return refused(format!(
                "add: a client {:?} is already served (remove it first, in the same command to replace it)",
                c.name
            ));
        }
        // Added beside a running client with the same key, the two would contest every route
        // and neither would be served: the peers file refuses this, and so does a live add.
        if let Some((holder, what)) = reg.clash(c, &gone) {
            return refused(format!(
                "add: client {:?} has the {what} of the running client {holder:?}; every client needs its own (remove {holder:?} first, in the same command to replace it)",
                c.name
            ));
        }
    }
    drop(reg);
    let mut reg = shared.registry.write();
    for name in &removed {
        reg.remove(name);
    }
    let now = clock::now();
    let mut answer = ChangeAnswer {
        removed,
        ..ChangeAnswer::default()
    };
    for c in &added {
        match reg.add(c, now) {
            Ok(_) => answer.added.push(c.name.clone()),
            // Checked above: only the index can still refuse (a full table, an inner pair
            // another client has). What was done stays done and is reported with the error.
            Err(e) => {
                answer.error = Some(format!(
                    "add: {e}; applied before it: added [{}], removed [{}]",
                    answer.added.join(", "),
                    answer.removed.join(", ")
                ));
                break;
            }
        }
    }
    answer
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    const K1: &str = "Sr+Xbsk1zWOyZ4MmCjIK6v2PeqfaZrnpZNYN76oF8VM=";

    fn table(pairs: &[(&str, &str)]) -> toml::Table {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), toml::Value::String(v.to_string())))
            .collect()
    }

    #[test]
    fn an_add_is_the_peers_file_line_it_stands_for() {
        let l = line_of(&table(&[
            ("name", "c9"),
            ("public_key", K1),
            ("remote_host", "2001:db8:c1:1::9"),
            ("remote_prefix", "2001:db8:c1::/64"),
        ]))
        .unwrap();
        assert_eq!(
            l.as_str(),
            format!("c9 {K1} 2001:db8:c1:1::9 prefix=2001:db8:c1::/64")
        );
        let e = line_of(&table(&[("name", "c9"), ("public_key", K1)])).unwrap_err();
        assert!(e.contains("remote_host"), "{e}");
        let e = line_of(&table(&[
            ("name", "c9"),
            ("public_key", K1),
            ("remote_host", "2001:db8:c1:1::9"),
            ("local_host", "2001:db8::1"),
        ]))
        .unwrap_err();
        assert!(e.contains("local_host"), "{e}");
        let e = line_of(&table(&[
            ("name", "c9"),
            ("public_key", K1),
            ("remote_host", "2001:db8:c1:1::9"),
            ("key_file", "/nonexistent/mt6d-test-key"),
        ]))
        .unwrap_err();
        assert!(e.contains("key_file") && e.contains("/nonexistent"), "{e}");
    }
}
