//! What a person on call needs to hear about each peer, once per change of state (the goal: "logs
//! that help at 3 a.m."): that nothing has arrived from it for [`PEER_SILENT_SECS`], that
//! packets arrive again, and that a handshake got no answer for [`NO_RESPONSE_SECS`], with the
//! likely cause. The handshake coming up is logged where it completes ([`super::session`]).
//!
//! Main thread only: it reads the per-peer counters the packet threads already keep, 4 times a
//! second, so nothing is added per packet. A peer with a sending key is looked at through
//! atomics alone; only a peer that has waited [`NO_RESPONSE_SECS`] for keys has its link
//! locked, for the handshake's statistics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mt6d_proto::UnixTime;

use super::peer::Peer;
use super::routing::carry_over;
use super::shared::Shared;

/// A peer that sent nothing this long is reported once (it is back when a packet arrives).
pub const PEER_SILENT_SECS: u64 = 30;
/// Without keys for this long although initiations went out: the handshake is reported down.
pub const NO_RESPONSE_SECS: u64 = 15;

#[derive(Debug, Clone)]
struct PeerLive {
    /// When the daemon started with this peer, or a reload added it.
    added: UnixTime,
    /// Packets (data, keepalives, handshake messages) received so far.
    seen: u64,
    last_rx: Option<UnixTime>,
    silent_logged: bool,
    had_keys: bool,
    /// Since when this peer has had no keys (handshake peers only).
    waiting_since: Option<UnixTime>,
    no_response_logged: bool,
}

/// Per-peer liveness, in the order of the table `generation` names.
#[derive(Debug, Default)]
pub struct Liveness {
    peers: Vec<(Arc<Peer>, PeerLive)>,
    generation: Option<u64>,
    /// When [`Liveness::tick`] last looked at the peers.
    last_look: Option<UnixTime>,
}

/// How often the peers are looked at: what a status's `last_rx_ms_ago` may lag by, and far
/// finer than the seconds its log lines are about.
const LOOK_EVERY_MS: u64 = 250;

impl PeerLive {
    fn new(now: UnixTime) -> PeerLive {
        PeerLive {
            added: now,
            seen: 0,
            last_rx: None,
            silent_logged: false,
            had_keys: false,
            waiting_since: Some(now),
            no_response_logged: false,
        }
    }
}

fn secs_between(from: UnixTime, to: UnixTime) -> u64 {
    to.as_millis().saturating_sub(from.as_millis()) / 1000
}

/// Everything received from `p` so far: delivered packets and drops attributed to it (a packet
/// that arrived and was refused still shows the peer is reachable), plus accepted handshake
/// messages. Atomics only.
fn received(p: &Peer) -> u64 {
    let drops: u64 = super::counters::DropReason::ALL
        .iter()
        .map(|r| p.counters.rx.drops(*r))
        .sum();
    p.counters.rx.packets.load(Ordering::Relaxed)
        + drops
        + p.counters.handshakes_rx.load(Ordering::Relaxed)
}

impl Liveness {
    /// Milliseconds since the last packet from peer `name`, if one ever arrived.
    pub fn last_rx_ms_ago(&self, name: &str, now: UnixTime) -> Option<u64> {
        self.peers
            .iter()
            .find(|(p, _)| p.name == name)?
            .1
            .last_rx
            .map(|t| now.as_millis().saturating_sub(t.as_millis()))
    }

    /// When the next tick looks at the peers again (None: at the first tick).
    pub fn next_look(&self) -> Option<UnixTime> {
        self.last_look
            .map(|t| UnixTime::from_millis(t.as_millis().saturating_add(LOOK_EVERY_MS)))
    }

    /// Notes what changed since the last tick and logs each change of state once.
    pub fn tick(&mut self, shared: &Shared, own_public_key: Option<&str>, now: UnixTime) {
        let table = shared.table.load();
        if self.generation == Some(table.generation)
            && self
                .last_look
                .is_some_and(|t| now.as_millis().saturating_sub(t.as_millis()) < LOOK_EVERY_MS)
        {
            return;
        }
        self.last_look = Some(now);
        if self.generation != Some(table.generation) {
            self.generation = Some(table.generation);
            self.peers = carry_over(std::mem::take(&mut self.peers), &table, |_| {
                PeerLive::new(now)
            });
        }
        for (p, s) in &mut self.peers {
            let n = received(p);
            if n != s.seen {
                s.seen = n;
                if s.silent_logged {
                    let since = s.last_rx.unwrap_or(s.added);
                    log::info!(
                        "peer {}: receiving again after {} s of silence",
                        p.name,
                        secs_between(since, now)
                    );
                    s.silent_logged = false;
                }
                s.last_rx = Some(now);
            } else if !s.silent_logged {
                let since = s.last_rx.unwrap_or(s.added);
                if secs_between(since, now) >= PEER_SILENT_SECS {
                    log::warn!(
                        "peer {}: nothing received for {PEER_SILENT_SECS} s{}",
                        p.name,
                        if s.last_rx.is_none() {
                            " since it was configured"
                        } else {
                            ""
                        }
                    );
                    s.silent_logged = true;
                }
            }
            if p.keys.send.load().is_some() {
                s.waiting_since = None;
                s.no_response_logged = false;
                s.had_keys = true;
                continue;
            }
            if s.had_keys || s.waiting_since.is_none() {
                s.waiting_since = Some(now);
            }
            s.had_keys = false;
            let since = s.waiting_since.unwrap_or(now);
            if s.no_response_logged || secs_between(since, now) < NO_RESPONSE_SECS {
                continue;
            }
            // Waited long enough to be reported: only now is the link locked.
            let link = p.link.lock();
            let Some(hs) = link.handshake() else {
                continue; // pre-shared: no handshake to report on
            };
            let st = hs.stats();
            if st.initiations_sent > 0 {
                let rejected: Vec<String> = st
                    .failures_by_reason()
                    .map(|(r, n)| format!("{n} {r}"))
                    .collect();
                let rejected = if rejected.is_empty() {
                    String::from("no handshake message from it arrived")
                } else {
                    format!("messages from it were rejected: {}", rejected.join(", "))
                };
                log::warn!(
                    "peer {}: handshake down: no response for {NO_RESPONSE_SECS} s to {} initiation(s) ({rejected}); likely cause: the peer is unreachable or not running, or a public_key is wrong (this gateway's [[peer]] public_key for {}, or the peer's public_key for this gateway, which is {}); with a wrong key the two derive different hashed addresses and never meet",
                    p.name,
                    st.initiations_sent,
                    p.name,
                    own_public_key.unwrap_or("?")
                );
                s.no_response_logged = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_between_never_underflow() {
        let a = UnixTime::from_millis(10_000);
        let b = UnixTime::from_millis(41_500);
        assert_eq!(secs_between(a, b), 31);
        assert_eq!(secs_between(b, a), 0);
    }
}
