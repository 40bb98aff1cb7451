//! SIGHUP and `mt6d reload` for a relay node (docs/CONFIG.md "The relay role"): the file is
//! read and validated again as a whole, compared here with what runs, and the new links are
//! built (keys, handshakes, counters) before the running node is touched; the data plane then
//! applies the result in one hold of the node's lock (`dataplane::reload`).
//!
//! What changes live: `[[relay.link]]` tables added, removed or changed (address, interface,
//! keys). A changed link is removed and added again: new keys, new handshakes, a new handle in
//! the node. Everything else (the node's identity, address, interfaces, ports, timing, workers,
//! files, log level, and the end-to-end peers, whose routes and guard routes into the TUN
//! device are set up at start) is refused by name, and a refused reload changes nothing.
//!
//! Owns the decision (pure: [`decide`]) and the new links' keys ([`prepare`]); must not touch
//! the node, a socket or the kernel.

use std::collections::HashMap;
use std::path::PathBuf;

use mt6d_proto::handshake::Handshake;
use mt6d_proto::{Sealer, Stream};

use super::run_sealer;
use crate::config::{LinkConfig, RelayConfig};
use crate::daemon::psk_counters::{CounterRange, GenerationError};

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The file does not parse or validate (the message names the file, line and column).
    #[error("reload refused, nothing changed: {0}")]
    Invalid(String),
    /// Settings a running node cannot take.
    #[error("reload refused, nothing changed: {path}: {} changed; a running relay node cannot take {}: restart it to apply them", keys.join(", "), if keys.len() == 1 { "it" } else { "them" })]
    Settings {
        path: PathBuf,
        keys: Vec<&'static str>,
    },
    /// A new or changed link leaves on an interface the node did not start with (checked, and
    /// given a neighbour responder, at start only).
    #[error("reload refused, nothing changed: {path}: link {link:?}: interface {interface} is not one the running node serves ({serves}); restart it to add an interface")]
    Interface {
        path: PathBuf,
        link: String,
        interface: String,
        serves: String,
    },
    /// A new link's stream or handshake could not be built.
    #[error("reload refused, nothing changed: link {link:?}: {message}")]
    Build { link: String, message: String },
    /// No fresh counters for the new pre-shared links.
    #[error("reload refused, nothing changed: counters for the new pre-shared links: {0}")]
    Counters(#[from] GenerationError),
}

/// What a valid reload does to the links, by name (in the order of the file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl Plan {
    /// The links of `new` that are not running as they are written (`running`, by name).
    pub fn between(running: &[LinkConfig], new: &RelayConfig) -> Plan {
        let old: HashMap<&str, &LinkConfig> =
            running.iter().map(|l| (l.name.as_str(), l)).collect();
        let mut plan = Plan::default();
        for l in &new.links {
            match old.get(l.name.as_str()) {
                None => plan.added.push(l.name.clone()),
                Some(o) if o.fingerprint() != l.fingerprint() => plan.changed.push(l.name.clone()),
                Some(_) => {}
            }
        }
        for o in running {
            if !new.links.iter().any(|l| l.name == o.name) {
                plan.removed.push(o.name.clone());
            }
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// Whether the running link `name` goes (removed, or changed: the old one goes).
    pub fn drops(&self, name: &str) -> bool {
        self.removed.iter().chain(&self.changed).any(|n| n == name)
    }

    /// Whether link `name` of the new file is to be built (added, or changed).
    pub fn builds(&self, name: &str) -> bool {
        self.added.iter().chain(&self.changed).any(|n| n == name)
    }
}

/// Decides a reload: `new` against the node as it runs (`running`, its settings: the file it
/// started with, as every reload that changed one was refused; `links`, its links now).
pub fn decide(
    running: &RelayConfig,
    links: &[LinkConfig],
    new: &RelayConfig,
) -> Result<Plan, Refusal> {
    let keys = running.changed_keys(new);
    if !keys.is_empty() {
        return Err(Refusal::Settings {
            path: new.path.clone(),
            keys,
        });
    }
    let plan = Plan::between(links, new);
    let serves = running.link_interfaces();
    if let Some(l) = new
        .links
        .iter()
        .find(|l| plan.builds(&l.name) && !serves.contains(&l.interface.as_str()))
    {
        return Err(Refusal::Interface {
            path: new.path.clone(),
            link: l.name.clone(),
            interface: l.interface.clone(),
            serves: serves.join(", "),
        });
    }
    Ok(plan)
}

/// How a new link is keyed.
#[allow(missing_debug_implementations)] // keys
pub enum Keying {
    Handshake(Box<Handshake>),
    /// Its sealer, over counters of a run generation drawn for this reload.
    PreShared(Sealer),
}

/// A link to add, built.
#[allow(missing_debug_implementations)] // keys
pub struct NewLink {
    pub cfg: LinkConfig,
    pub stream: Stream,
    pub keying: Keying,
}

/// Builds every link the plan adds or changes. A pre-shared one seals with counters `reserve`
/// draws (once per reload, only if one is pre-shared): a new run generation, above every range
/// any run or reload of the state directory used before, so a link removed and added again,
/// or whose key is still one that sealed earlier in this run, never repeats a (key, counter)
/// pair (docs/ARCHITECTURE.md "Relays", "Nonces across a reload"). Handshake links start
/// without keys and take fresh ones from their first handshake.
pub fn prepare(
    plan: &Plan,
    new: &RelayConfig,
    reserve: impl FnOnce() -> Result<CounterRange, GenerationError>,
) -> Result<Vec<NewLink>, Refusal> {
    let building: Vec<&LinkConfig> = new.links.iter().filter(|l| plan.builds(&l.name)).collect();
    let counters = if building.iter().any(|l| l.handshake.is_none()) {
        Some(reserve()?)
    } else {
        None
    };
    building
        .into_iter()
        .map(|l| {
            let build = |e: &dyn std::fmt::Display| Refusal::Build {
                link: l.name.clone(),
                message: e.to_string(),
            };
            let stream = Stream::new(l.stream.clone()).map_err(|e| build(&e))?;
            let keying = match (&l.handshake, counters) {
                (Some(hs), _) => {
                    Keying::Handshake(Box::new(Handshake::new(hs.clone()).map_err(|e| build(&e))?))
                }
                (None, Some(run)) => Keying::PreShared(run_sealer(&stream, run)),
                // Drawn above whenever a pre-shared link is built.
                (None, None) => return Err(build(&"no counters were drawn")),
            };
            Ok(NewLink {
                cfg: l.clone(),
                stream,
                keying,
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::keys;
    use mt6d_proto::Epoch;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("mt6d-relayreload-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (name, byte) in [("l1.key", 1u8), ("l2.key", 2), ("l3.key", 3)] {
            let p = d.join(name);
            std::fs::write(&p, keys::encode(&[byte; 32]).as_bytes()).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let k = keys::new_private_key().unwrap();
        keys::write_secret_file(&d.join("id.key"), &keys::encode(&k.to_bytes()[..])).unwrap();
        Dir(d)
    }

    fn public() -> String {
        keys::public_key_text(&keys::new_private_key().unwrap().public_key())
    }

    /// A relay's file: `[relay]` with `extra` settings, then `links` (name, last group of the
    /// address, keying line).
    fn file(d: &Dir, extra: &str, links: &[(&str, u16, String)]) -> RelayConfig {
        let state = if extra.contains("state_dir") {
            ""
        } else {
            "state_dir = \"state\"\n"
        };
        let mut text = format!(
            "[relay]\nexternal_interface = \"eth0\"\naddress = \"2001:db8:ff:1::1\"\nprivate_key_file = \"id.key\"\ncontrol_socket = \"/tmp/mt6d-relayreload-test.sock\"\n{state}{extra}\n"
        );
        for (name, n, keying) in links {
            text.push_str(&format!(
                "[[relay.link]]\nname = \"{name}\"\naddress = \"2001:db8:ff:{n}::1\"\n{keying}\n"
            ));
        }
        RelayConfig::parse(&d.0.join("relay.toml"), &text).unwrap()
    }

    fn psk(file: &str) -> String {
        format!("key_file = \"{file}\"")
    }

    #[test]
    fn links_added_removed_and_changed_apply_and_every_other_setting_is_refused_by_name() {
        let d = dir("diff");
        let hs = format!("public_key = \"{}\"", public());
        let running = file(
            &d,
            "",
            &[
                ("r2", 2, psk("l1.key")),
                ("r3", 3, hs.clone()),
                ("r4", 4, psk("l2.key")),
            ],
        );
        // r2's key changes, r3 is unchanged, r4 goes, r5 is new.
        let new = file(
            &d,
            "",
            &[
                ("r2", 2, psk("l3.key")),
                ("r3", 3, hs.clone()),
                ("r5", 5, psk("l2.key")),
            ],
        );
        let plan = decide(&running, &running.links, &new).unwrap();
        assert_eq!(
            plan,
            Plan {
                added: vec!["r5".into()],
                removed: vec!["r4".into()],
                changed: vec!["r2".into()],
            }
        );
        assert!(plan.drops("r2") && plan.drops("r4") && !plan.drops("r3"));
        assert!(plan.builds("r2") && plan.builds("r5") && !plan.builds("r3"));
        // A new address or a new neighbour's key is a changed link too.
        let moved = file(
            &d,
            "",
            &[
                ("r2", 6, psk("l1.key")),
                ("r3", 3, format!("public_key = \"{}\"", public())),
                ("r4", 4, psk("l2.key")),
            ],
        );
        let plan = decide(&running, &running.links, &moved).unwrap();
        assert_eq!(plan.changed, ["r2", "r3"]);
        assert!(plan.added.is_empty() && plan.removed.is_empty());
        assert!(decide(&running, &running.links, &running)
            .unwrap()
            .is_empty());
        // Node settings and end-to-end peers: refused, each by its key, whatever else changed.
        for (extra, key) in [
            ("listen_port = 7000", "listen_port"),
            ("workers = 3", "workers"),
            ("rotation_secs = 20", "rotation_secs"),
            ("log_level = \"debug\"", "log_level"),
            ("state_dir = \"elsewhere\"", "state_dir"),
            ("mtu = 9000", "mtu"),
            ("neighbor_discovery = false", "neighbor_discovery"),
        ] {
            let other = file(&d, extra, &[("r2", 2, psk("l1.key"))]);
            match decide(&running, &running.links, &other) {
                Err(Refusal::Settings { keys, .. }) => assert_eq!(keys, [key], "{extra}"),
                other => panic!("{extra}: {other:?}"),
            }
            let e = decide(&running, &running.links, &other)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("relay.toml"), "{e}");
        }
        let edge = file(&d, "", &[("r2", 2, psk("l1.key"))]);
        let mut with_e2e = edge.clone();
        with_e2e.e2e = file_with_e2e(&d).e2e;
        assert_eq!(edge.changed_keys(&with_e2e), ["[[relay.e2e]]"]);
        // A link on an interface the node does not serve.
        let mut elsewhere = running.clone();
        elsewhere.links[0].interface = "eth9".into();
        match decide(&running, &running.links, &elsewhere) {
            Err(Refusal::Interface {
                link, interface, ..
            }) => {
                assert_eq!((link.as_str(), interface.as_str()), ("r2", "eth9"));
            }
            other => panic!("{other:?}"),
        }
    }

    fn file_with_e2e(d: &Dir) -> RelayConfig {
        let text = format!(
            "[relay]\nexternal_interface = \"eth0\"\naddress = \"2001:db8:ff:1::1\"\nprivate_key_file = \"id.key\"\ncontrol_socket = \"/tmp/mt6d-relayreload-test.sock\"\nstate_dir = \"state\"\n[[relay.link]]\nname = \"r2\"\naddress = \"2001:db8:ff:2::1\"\nkey_file = \"l1.key\"\n[[relay.e2e]]\nname = \"a-b\"\npublic_key = \"{}\"\nlocal_host = \"fd00:1::10\"\nremote_host = \"fd00:2::10\"\n",
            public()
        );
        RelayConfig::parse(&d.0.join("relay.toml"), &text).unwrap()
    }

    /// The first counter a sealer seals with.
    fn first_counter(sealer: &Sealer, stream: &Stream) -> u64 {
        let mut out = [0u8; 64];
        sealer
            .seal_keepalive(&stream.route(Epoch(1)), &mut out)
            .unwrap();
        u64::from_be_bytes(out[..8].try_into().unwrap())
    }

    /// A pre-shared link removed by one reload and added again by the next (the same key)
    /// seals above every counter the run and the earlier reloads drew: no (key, counter) pair
    /// twice. Handshake links draw nothing.
    #[test]
    fn a_pre_shared_link_added_again_never_reuses_a_counter_of_its_key() {
        let d = dir("nonce");
        let state = d.0.join("state");
        let start = crate::daemon::psk_counters::reserve_run(&state).unwrap();
        let hs = format!("public_key = \"{}\"", public());
        let one = file(&d, "", &[("r2", 2, psk("l1.key")), ("r3", 3, hs.clone())]);
        let without = file(&d, "", &[("r3", 3, hs.clone())]);
        let plan = decide(&one, &one.links, &without).unwrap();
        assert_eq!(plan.removed, ["r2"]);
        let mut drawn = 0;
        let reserve = || crate::daemon::psk_counters::reserve_run(&state);
        assert!(prepare(&plan, &without, || {
            drawn += 1;
            reserve()
        })
        .unwrap()
        .is_empty());
        assert_eq!(drawn, 0, "nothing pre-shared was built: no counters drawn");
        let mut firsts = Vec::new();
        for _ in 0..2 {
            let plan = decide(&one, &without.links, &one).unwrap();
            assert_eq!(plan.added, ["r2"]);
            let built = prepare(&plan, &one, reserve).unwrap();
            let [NewLink {
                stream,
                keying: Keying::PreShared(sealer),
                ..
            }] = &built[..]
            else {
                panic!("one pre-shared link built");
            };
            firsts.push(first_counter(sealer, stream));
        }
        assert!(
            firsts[0] >= start.end,
            "{firsts:?} reuses the start's range {start:?}"
        );
        assert!(firsts[1] >= firsts[0] + (1 << crate::daemon::psk_counters::RUN_BITS));
        // A handshake link changed (a new neighbour key) is built with no counters drawn.
        let rekeyed = file(
            &d,
            "",
            &[
                ("r2", 2, psk("l1.key")),
                ("r3", 3, format!("public_key = \"{}\"", public())),
            ],
        );
        let plan = decide(&one, &one.links, &rekeyed).unwrap();
        assert_eq!(plan.changed, ["r3"]);
        let built = prepare(&plan, &rekeyed, || {
            panic!("drew counters for a handshake link")
        })
        .unwrap();
        assert!(matches!(
            built[..],
            [NewLink {
                keying: Keying::Handshake(_),
                ..
            }]
        ));
    }
}
