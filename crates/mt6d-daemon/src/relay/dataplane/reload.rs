//! A reload applied to the running node (the decision and the new links' keys:
//! [`crate::relay::reload`]): in one hold of the node's lock, the links that go are removed
//! (their routes withdrawn, their queued messages dropped, their sender sockets closed), the new
//! ones added under handles never used before, and the receive gate republished before anything
//! the node queued is sent. Everything that can fail (reading the file, validating it, building
//! keys and handshakes, drawing counters) happens before the lock, so a refused reload leaves
//! the node exactly as it was.

use super::*;
use crate::relay::reload::{decide, prepare, Keying, Plan, Refusal};

impl Worker<'_> {
    /// SIGHUP and `mt6d reload` (`by` names the cause in the log): what changed, or why
    /// nothing did.
    pub(super) fn reload(&mut self, by: &str) -> ChangeAnswer {
        match self.try_reload(by) {
            Ok(plan) => ChangeAnswer {
                added: plan.added,
                removed: plan.removed,
                changed: plan.changed,
                error: None,
            },
            Err(e) => {
                log::warn!("{by}: {e}");
                ChangeAnswer {
                    error: Some(e.to_string()),
                    ..ChangeAnswer::default()
                }
            }
        }
    }

    fn try_reload(&mut self, by: &str) -> Result<Plan, Refusal> {
        let shared = self.shared;
        let cfg = shared.cfg;
        let new = RelayConfig::load(&cfg.path).map_err(|e| Refusal::Invalid(e.to_string()))?;
        // Only this thread changes the links: they are the same when the lock is taken again.
        let running: Vec<LinkConfig> = shared.core.lock().links.values().cloned().collect();
        let plan = decide(cfg, &running, &new)?;
        if plan.is_empty() {
            log::info!(
                "{by}: {} is valid and the same as the running configuration",
                cfg.path.display()
            );
            return Ok(plan);
        }
        let built = prepare(&plan, &new, || {
            crate::daemon::psk_counters::reserve_run(&cfg.state_dir)
        })?;
        let mut core = shared.core.lock();
        let now = clock::now();
        let going: Vec<Neighbour> = core
            .links
            .iter()
            .filter(|(_, l)| plan.drops(&l.name))
            .map(|(&n, _)| n)
            .collect();
        for n in going {
            if let Err(e) = core.node.remove_link(now, n) {
                // The node holds every link of `core.links`; logged should that ever break.
                log::error!("{by}: remove link {}: {e}", core.link_name(n));
            }
            core.send_from.remove(&n);
            core.links.remove(&n);
        }
        for l in built {
            let n = Neighbour(core.next_link);
            core.next_link = core.next_link.saturating_add(1);
            let added = match l.keying {
                Keying::Handshake(hs) => core.node.add_link_handshake(now, n, l.stream, *hs),
                Keying::PreShared(sealer) => core.node.add_link(now, n, l.stream, sealer),
            };
            match added {
                Ok(()) => {
                    core.links.insert(n, l.cfg);
                }
                // A fresh handle and an encrypt-mode stream (the file's links always are):
                // logged should that ever break, and the link is not shown as running.
                Err(e) => log::error!("{by}: add link {:?}: {e}", l.cfg.name),
            }
        }
        self.reconcile_senders(&core);
        self.drain(&mut core, now);
        drop(core);
        log::info!(
            "{by}: {}: links added {:?}, removed {:?}, changed {:?}",
            cfg.path.display(),
            plan.added,
            plan.removed,
            plan.changed
        );
        Ok(plan)
    }
}
