//! Each node's files: its identity key, the host pairs' pre-shared keys and its configuration
//! file (docs/CONFIG.md "The relay role"), written from the lab's plan and settings, and
//! `mt6d check` on them.

use std::net::Ipv6Addr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use mt6d::keys;
use serde::Serialize;

use super::{cmd_err, Link, RelayLab};
use crate::topology::LabError;

impl RelayLab {
    /// Keys (an identity key per node: links are keyed by Noise IK handshakes between them;
    /// one pre-shared key per host pair; all 0600) and one configuration file per node.
    pub(super) fn write_files(&mut self) -> Result<(), LabError> {
        let key_err = |e: keys::KeyError| cmd_err(e);
        for node in &mut self.nodes {
            let private = keys::new_private_key().map_err(key_err)?;
            let path = self.dir.join(format!("{}.key", node.name));
            keys::write_secret_file(&path, &keys::encode(private.to_bytes().as_slice()))
                .map_err(key_err)?;
            node.identity = Some((path, keys::public_key_text(&private.public_key())));
        }
        let psk = |path: &Path| {
            keys::write_secret_file(path, &keys::encode(keys::random32()?.as_slice()))
        };
        for &(a, b) in &self.pairs {
            psk(&self.pair_key(a, b)).map_err(key_err)?;
        }
        for i in 0..self.nodes.len() {
            let state = self.dir.join(format!("state-{}", self.nodes[i].name));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&state)
                .map_err(|e| cmd_err(format!("{}: {e}", state.display())))?;
            self.write_config(i)?;
        }
        Ok(())
    }

    /// Writes node `i`'s configuration file from the lab's settings.
    pub(super) fn write_config(&self, i: usize) -> Result<(), LabError> {
        let state = self.dir.join(format!("state-{}", self.nodes[i].name));
        let text = self.config_text(i, &state)?;
        std::fs::write(&self.nodes[i].config, text)
            .map_err(|e| cmd_err(format!("{}: {e}", self.nodes[i].config.display())))
    }
    fn pair_key(&self, a: usize, b: usize) -> PathBuf {
        self.dir.join(format!(
            "e2e-{}-{}.key",
            self.hosts[a].name, self.hosts[b].name
        ))
    }
    /// Node `i`'s file (docs/CONFIG.md "The relay role").
    fn config_text(&self, i: usize, state: &Path) -> Result<String, LabError> {
        let node = &self.nodes[i];
        let links: Vec<(&Link, usize, &String)> = self
            .links
            .iter()
            .filter_map(|l| match (l.a == i, l.b == i) {
                (true, _) => Some((l, l.b, &l.if_a)),
                (_, true) => Some((l, l.a, &l.if_b)),
                _ => None,
            })
            .collect();
        let Some(&(_, _, first_if)) = links.first() else {
            return Err(cmd_err(format!("node {} has no link", node.name)));
        };
        let mut e2e = Vec::new();
        for &(a, b) in &self.pairs {
            let (local, remote) = match (self.hosts[a].edge == i, self.hosts[b].edge == i) {
                (true, _) => (a, b),
                (_, true) => (b, a),
                _ => continue,
            };
            let far = &self.nodes[self.hosts[remote].edge];
            let Some((_, public)) = &far.identity else {
                return Err(cmd_err(format!(
                    "edge gateway {} has no identity key",
                    far.name
                )));
            };
            e2e.push(E2eSection {
                name: format!("{}-{}", self.hosts[local].name, self.hosts[remote].name),
                public_key: public.clone(),
                local_host: self.hosts[local].address,
                remote_host: self.hosts[remote].address,
                key_file: self.pair_key(a, b).display().to_string(),
            });
        }
        let file = RelayFile {
            relay: RelaySection {
                external_interface: first_if.clone(),
                address: node.address,
                private_key_file: node.identity.as_ref().map(|(p, _)| p.display().to_string()),
                rotation_secs: self.settings.rotation_secs,
                rekey_secs: lab_rekey_secs(self.settings.rotation_secs),
                jitter: self.settings.jitter,
                workers: self.settings.workers,
                state_dir: state.display().to_string(),
                control_socket: node.socket.display().to_string(),
                metrics_listen: METRICS_LISTEN.to_string(),
                log_level: self.settings.log_level.clone(),
                link: links
                    .iter()
                    .map(|(_, peer, my_if)| {
                        let far = &self.nodes[*peer];
                        LinkSection {
                            name: far.name.clone(),
                            address: far.address,
                            interface: (*my_if).clone(),
                            public_key: far
                                .identity
                                .as_ref()
                                .map(|(_, public)| public.clone())
                                .unwrap_or_default(),
                        }
                    })
                    .collect(),
                e2e,
            },
        };
        let body = toml::to_string(&file).map_err(cmd_err)?;
        Ok(format!(
            "# Generated for node {} of the {} relay lab (namespace {}).\n{body}",
            node.name,
            self.shape.name(),
            node.ns.name()
        ))
    }

    /// `mt6d check -c FILE` on every node's file: what the check said of each that it refused.
    pub fn check_configs(&self) -> Vec<String> {
        let mut refused = Vec::new();
        for node in &self.nodes {
            let out = node.ns.command(&self.settings.mt6d).and_then(|mut c| {
                c.arg("check")
                    .arg("-c")
                    .arg(&node.config)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| mt6d_os::OsError::InvalidArgument(e.to_string()))
            });
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => refused.push(format!(
                    "{}: {}{}",
                    node.name,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )),
                Err(e) => refused.push(format!("{}: {e}", node.name)),
            }
        }
        refused
    }
}

#[derive(Debug, Serialize)]
struct RelayFile {
    relay: RelaySection,
}

/// `[relay]`, with the keys the lab sets (docs/CONFIG.md "The relay role").
#[derive(Debug, Serialize)]
struct RelaySection {
    external_interface: String,
    address: Ipv6Addr,
    #[serde(skip_serializing_if = "Option::is_none")]
    private_key_file: Option<String>,
    rotation_secs: f64,
    rekey_secs: f64,
    jitter: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<usize>,
    state_dir: String,
    control_socket: String,
    metrics_listen: String,
    log_level: String,
    link: Vec<LinkSection>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    e2e: Vec<E2eSection>,
}

#[derive(Debug, Serialize)]
struct LinkSection {
    name: String,
    address: Ipv6Addr,
    interface: String,
    public_key: String,
}

/// Where every node of the lab serves its metrics page, inside its own namespace.
pub const METRICS_LISTEN: &str = "[::1]:9588";

/// The links' rekey interval in the lab: five rotations, at least 5 s, so that a test of a few
/// tens of seconds crosses several rekeys of every link (production: `rekey_secs`, 120 s).
pub(super) fn lab_rekey_secs(rotation_secs: f64) -> f64 {
    (5.0 * rotation_secs).max(5.0)
}

#[derive(Debug, Serialize)]
struct E2eSection {
    name: String,
    public_key: String,
    local_host: Ipv6Addr,
    remote_host: Ipv6Addr,
    key_file: String,
}
