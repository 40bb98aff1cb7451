//! Two gateways that share only public keys, in memory: a virtual clock, a network with loss,
//! duplication and reordering, and per gateway a driver of `mt6d_proto::link::Link`, the object
//! the daemon drives (`common::gateway`): the link polls its timer, answers messages, hands out
//! keys and switches a responder's send key on confirmation; the simulation only moves bytes.
//! Proves: handshakes complete under loss/reordering/duplication and simultaneous initiation;
//! replayed handshake messages are rejected; rekeying during a packet stream loses nothing; no
//! (key, nonce) pair is ever used twice, across restarts too.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod common;
use common::gateway::{Packet, SimGateway};
use common::{handshake_config, A, B, START_MS};

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use mt6d_proto::handshake::{HandshakeError, HandshakeStats, PrivateKey, Psk, ReceiveKeys};
use mt6d_proto::link::Link;
use mt6d_proto::{Route, UnixTime};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One side: its identity (kept across restarts) and its driver.
struct Gateway {
    private: PrivateKey,
    g: SimGateway,
}

impl Gateway {
    fn new(
        private: PrivateKey,
        peer: &PrivateKey,
        local: &str,
        remote: &str,
        rekey: Duration,
    ) -> Self {
        let cfg = mt6d_proto::handshake::HandshakeConfig {
            psk: Psk::from_bytes([0x44; 32]),
            rekey_after: rekey,
            ..handshake_config(&private, peer, local, remote)
        };
        Gateway {
            private,
            g: SimGateway::new(cfg, Duration::from_secs(2)),
        }
    }

    /// The daemon after a restart: same identity, no keys, no handshake state.
    fn restarted(&self, peer: &PrivateKey, local: &str, remote: &str, rekey: Duration) -> Self {
        Gateway::new(self.private.clone(), peer, local, remote, rekey)
    }

    /// A server's side of one client: it answers handshakes and never initiates one.
    fn server(private: PrivateKey, peer: &PrivateKey, rekey: Duration) -> Self {
        let cfg = mt6d_proto::handshake::HandshakeConfig {
            psk: Psk::from_bytes([0x44; 32]),
            rekey_after: rekey,
            ..handshake_config(&private, peer, B, A)
        };
        Gateway {
            private,
            g: SimGateway::responder_only(cfg, Duration::from_secs(2)),
        }
    }

    fn stats(&self) -> &HandshakeStats {
        self.g.hs_stats()
    }

    fn delivered(&self) -> &[u64] {
        &self.g.delivered
    }
}

struct Datagram {
    to_b: bool,
    p: Packet,
}

#[derive(Clone, Copy)]
struct Net {
    loss: f64,
    dup: f64,
    max_delay_ms: u64,
    /// Every datagram takes at least this long (half the round trip).
    min_delay_ms: u64,
    /// A man-on-the-side without keys replays every handshake message it has seen, to both
    /// gateways, each time a new one is sent.
    replay_attack: bool,
}

const CLEAN: Net = Net {
    loss: 0.0,
    dup: 0.0,
    max_delay_ms: 0,
    min_delay_ms: 0,
    replay_attack: false,
};

struct Sim {
    now_ms: u64,
    a: Gateway,
    b: Gateway,
    rng: ChaCha8Rng,
    net: Net,
    in_flight: BTreeMap<(u64, u64), Datagram>,
    seq: u64,
    /// Every (key id, counter field) sealed, to prove nonces never repeat.
    nonces: HashSet<(u64, u64)>,
    /// Every handshake message sent, for replay tests.
    handshakes_sent: Vec<Datagram>,
    /// Side B's process is not running: what reaches it is lost, its timer does not run.
    b_down: bool,
}

impl Sim {
    fn new(seed: u64, net: Net, rekey: Duration) -> Sim {
        let ka = PrivateKey::generate([0xa1; 32]);
        let kb = PrivateKey::generate([0xb2; 32]);
        Sim {
            now_ms: START_MS,
            a: Gateway::new(ka.clone(), &kb, A, B, rekey),
            b: Gateway::new(kb, &ka, B, A, rekey),
            rng: ChaCha8Rng::seed_from_u64(seed),
            net,
            in_flight: BTreeMap::new(),
            seq: 0,
            nonces: HashSet::new(),
            handshakes_sent: Vec::new(),
            b_down: false,
        }
    }

    fn now(&self) -> UnixTime {
        UnixTime::from_millis(self.now_ms)
    }

    fn gw(&mut self, b: bool) -> &mut Gateway {
        if b {
            &mut self.b
        } else {
            &mut self.a
        }
    }

    /// Moves what side `b` sealed since the last call into the global record, asserting that no
    /// (key, nonce) pair ever repeats.
    fn check_nonces(&mut self, b: bool) {
        let sealed = std::mem::take(&mut self.gw(b).g.nonces);
        for id in sealed {
            assert!(self.nonces.insert(id), "nonce reused: {id:?}");
        }
    }

    /// Puts datagrams from side `from_b` on the wire (header protection is already applied, so
    /// captures for replay, the replaying attacker and delivery all see the wire bytes).
    fn transmit_all(&mut self, from_b: bool, ps: Vec<Packet>) {
        self.check_nonces(from_b);
        for p in ps {
            self.transmit(from_b, p);
        }
    }

    fn transmit(&mut self, from_b: bool, p: Packet) {
        if p.handshake && self.net.replay_attack {
            self.replay_everything(&p, from_b);
        }
        if p.handshake {
            self.handshakes_sent.push(Datagram {
                to_b: !from_b,
                p: p.clone(),
            });
        }
        let copies = if self.rng.random_bool(self.net.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.random_bool(self.net.loss) {
                continue;
            }
            let delay = self.rng.random_range(
                self.net.min_delay_ms..=self.net.max_delay_ms.max(self.net.min_delay_ms),
            );
            self.seq += 1;
            self.in_flight.insert(
                (self.now_ms + delay, self.seq),
                Datagram {
                    to_b: !from_b,
                    p: p.clone(),
                },
            );
        }
    }

    /// The attacker: this message (delivered at once, ahead of the genuine copy) and every
    /// earlier one, to its own destination on its own route, and to both gateways on the route
    /// of the current message in both directions.
    fn replay_everything(&mut self, current: &Packet, from_b: bool) {
        let mut all: Vec<(bool, Packet)> = self
            .handshakes_sent
            .iter()
            .rev()
            .take(32)
            .map(|d| (d.to_b, d.p.clone()))
            .collect();
        all.push((!from_b, current.clone()));
        for (to_b, msg) in all {
            for (src, dst, b) in [
                (msg.src, msg.dst, to_b),
                (current.src, current.dst, !from_b),
                (current.dst, current.src, from_b),
            ] {
                self.seq += 1;
                self.in_flight.insert(
                    (self.now_ms + 1, self.seq),
                    Datagram {
                        to_b: b,
                        p: Packet {
                            src,
                            dst,
                            ..msg.clone()
                        },
                    },
                );
            }
        }
    }

    fn entropy(&mut self) -> [u8; 32] {
        self.rng.random()
    }

    /// The daemon's timer for side `b`.
    fn tick(&mut self, b: bool) {
        if b && self.b_down {
            return;
        }
        let now = self.now();
        let entropy = self.entropy();
        let out = self.gw(b).g.timeout(now, entropy);
        self.transmit_all(b, out);
    }

    /// The protected host behind `b` sends packet number `seq`.
    fn send_data(&mut self, b: bool, seq: u64) -> bool {
        let now = self.now();
        let Some(p) = self.gw(b).g.send_data(now, seq) else {
            return false;
        };
        self.transmit_all(b, vec![p]);
        true
    }

    fn deliver(&mut self, d: Datagram) {
        if d.to_b && self.b_down {
            return;
        }
        let now = self.now();
        let entropy = self.entropy();
        let out = self.gw(d.to_b).g.receive(now, &d.p, entropy);
        self.transmit_all(d.to_b, out);
    }

    /// Advances the clock by `ms`, delivering due datagrams and ticking both timers every 10 ms.
    fn run_ms(&mut self, ms: u64) {
        let end = self.now_ms + ms;
        while self.now_ms < end {
            self.now_ms += 1;
            while let Some(entry) = self.in_flight.first_entry() {
                if entry.key().0 > self.now_ms {
                    break;
                }
                let d = entry.remove();
                self.deliver(d);
            }
            if self.now_ms % 10 == 0 {
                self.tick(false);
                self.tick(true);
            }
        }
    }

    fn established(&self) -> bool {
        self.a.g.keys.send().is_some() && self.b.g.keys.send().is_some()
    }
}

#[test]
fn handshake_completes_under_loss_reordering_and_duplication() {
    for seed in 0..20 {
        let net = Net {
            loss: 0.3,
            dup: 0.2,
            max_delay_ms: 40,
            ..CLEAN
        };
        let mut sim = Sim::new(seed, net, Duration::from_secs(120));
        let mut waited = 0;
        while !sim.established() {
            sim.run_ms(100);
            waited += 100;
            assert!(waited < 30_000, "seed {seed}: no keys after 30 s");
        }
        // Data flows both ways once established (lossy network: some of it arrives).
        for i in 0..200 {
            sim.send_data(false, i);
            sim.send_data(true, 1000 + i);
            sim.run_ms(5);
        }
        sim.run_ms(100);
        assert!(sim.b.delivered().len() > 100, "seed {seed}");
        assert!(sim.a.delivered().len() > 100, "seed {seed}");
        assert!(sim.a.stats().completed + sim.b.stats().completed >= 2);
    }
}

#[test]
fn simultaneous_initiation_resolves_to_one_handshake() {
    let mut sim = Sim::new(7, CLEAN, Duration::from_secs(120));
    // Both timers fire in the same millisecond with a 5 ms one-way delay: both initiations cross.
    sim.net.max_delay_ms = 0;
    sim.tick(false);
    sim.tick(true);
    assert_eq!(sim.in_flight.len(), 2);
    sim.run_ms(50);
    assert!(sim.established());
    let (sa, sb) = (sim.a.stats().clone(), sim.b.stats().clone());
    assert_eq!(sa.completed, 1, "{sa:?}");
    assert_eq!(sb.completed, 1, "{sb:?}");
    // The preferred initiator ignored the other's initiation, the other answered.
    let preferred = if sim.a.g.link.handshake().unwrap().is_preferred_initiator() {
        &sa
    } else {
        &sb
    };
    let other = if sim.a.g.link.handshake().unwrap().is_preferred_initiator() {
        &sb
    } else {
        &sa
    };
    assert_eq!(
        preferred.failures_by_reason().collect::<Vec<_>>(),
        vec![("hs_simultaneous", 1)]
    );
    assert_eq!(other.responses_sent, 1);
    assert_eq!(preferred.responses_sent, 0);
    for i in 0..10 {
        assert!(sim.send_data(false, i));
        assert!(sim.send_data(true, 100 + i));
    }
    sim.run_ms(10);
    assert_eq!(sim.a.delivered().len(), 10);
    assert_eq!(sim.b.delivered().len(), 10);
}

#[test]
fn responder_sends_with_new_keys_only_after_confirmation() {
    let mut sim = Sim::new(3, CLEAN, Duration::from_secs(120));
    // Only A's timer runs: A initiates, B answers.
    sim.tick(false);
    // Deliver the initiation to B by hand, then the response to A, but lose A's keepalive.
    let init = sim.in_flight.pop_first().unwrap().1;
    sim.deliver(init);
    assert_eq!(
        sim.b.g.link.select(sim.now()).bound.len(),
        2,
        "responder binds the answered session's route set at once"
    );
    assert!(
        sim.b.g.keys.send().is_none(),
        "no send key before confirmation"
    );
    let resp = sim.in_flight.pop_first().unwrap().1;
    sim.deliver(resp);
    assert!(sim.a.g.keys.send().is_some(), "initiator has keys at once");
    let keepalive = sim.in_flight.pop_first().unwrap().1;
    assert_eq!(keepalive.p.bytes.len(), 24);
    drop(keepalive);
    assert!(sim.b.g.keys.send().is_none());
    // A's first data packet confirms instead.
    assert!(sim.send_data(false, 1));
    sim.run_ms(1);
    assert_eq!(sim.b.delivered(), [1]);
    assert!(sim.b.g.keys.send().is_some(), "confirmed by A's data");
    assert!(sim.send_data(true, 2));
    sim.run_ms(1);
    assert_eq!(sim.a.delivered(), [2]);
}

#[test]
fn replayed_handshake_messages_are_rejected() {
    let mut sim = Sim::new(11, CLEAN, Duration::from_secs(3));
    sim.run_ms(100);
    assert!(sim.established());
    // Let a rekey happen so there are old messages to replay.
    sim.run_ms(5_000);
    let before_a = sim.a.stats().clone();
    let before_b = sim.b.stats().clone();
    let old: Vec<Datagram> = sim
        .handshakes_sent
        .iter()
        .map(|d| Datagram {
            to_b: d.to_b,
            p: d.p.clone(),
        })
        .collect();
    assert!(old.len() >= 4);
    // Same epoch replay (re-deliver instantly after sending is what an on-path attacker can do
    // best): replays of everything already seen are rejected; those from earlier epochs fail the
    // route-bound MAC or find no accept route at all.
    for d in old {
        sim.deliver(d);
    }
    let (a, b) = (sim.a.stats(), sim.b.stats());
    assert_eq!(
        a.completed, before_a.completed,
        "no handshake from a replay"
    );
    assert_eq!(b.completed, before_b.completed);
    assert_eq!(a.responses_sent, before_a.responses_sent);
    assert_eq!(b.responses_sent, before_b.responses_sent);
    // A fresh replay within the epoch: capture the next initiation and play it twice.
    let now = sim.now();
    sim.a.g.link.handle_no_send_key();
    let init = sim
        .a
        .g
        .timeout(now, [9; 32])
        .pop()
        .expect("a wanted initiation");
    assert!(init.handshake);
    let replayed = |g: &Gateway| {
        g.stats()
            .failures_by_reason()
            .find_map(|(r, n)| (r == "hs_replayed").then_some(n))
            .unwrap_or(0)
    };
    let (responses, replays) = (sim.b.stats().responses_sent, replayed(&sim.b));
    assert_eq!(sim.b.g.receive(now, &init, [1; 32]).len(), 1);
    assert!(sim.b.g.receive(now, &init, [2; 32]).is_empty());
    assert_eq!(sim.b.stats().responses_sent, responses + 1);
    assert_eq!(replayed(&sim.b), replays + 1);
    // Same initiation bytes on another epoch's route of the same set: the MAC binds the route.
    let selection = sim.b.g.link.select(now);
    let (set, bytes) = selection
        .bound
        .iter()
        .find_map(|b| {
            Link::schedule_of(&b.set, now)
                .accept
                .iter()
                .any(|r| r.local == init.dst && r.remote == init.src)
                .then(|| {
                    let mut bytes = init.bytes.clone();
                    b.set
                        .stream
                        .recv_header_key()
                        .unwrap()
                        .unprotect(&mut bytes)
                        .unwrap();
                    (b.set.clone(), bytes)
                })
        })
        .unwrap();
    let later = UnixTime::from_millis(sim.now_ms + 4_000);
    let other_in: Route = Link::schedule_of(&set, later).send;
    assert_ne!(other_in.epoch, Link::schedule_of(&set, now).send.epoch);
    assert_eq!(
        sim.b
            .g
            .link
            .handle_handshake(
                later,
                &set,
                &other_in,
                &bytes,
                &mut ReceiveKeys::new(),
                || { Some([3; 32]) }
            )
            .unwrap_err(),
        HandshakeError::BadMac
    );
}

#[test]
fn rekeying_during_a_packet_stream_loses_nothing() {
    for seed in 0..4 {
        let net = Net {
            loss: 0.0,
            dup: 0.05,
            max_delay_ms: 8,
            ..CLEAN
        };
        let mut sim = Sim::new(100 + seed, net, Duration::from_secs(2));
        sim.run_ms(200);
        assert!(sim.established());
        let n = 3_000u64; // one packet each way every 10 ms for 30 s: ~15 rekeys
        for i in 0..n {
            assert!(sim.send_data(false, i), "A had no send key at {i}");
            assert!(sim.send_data(true, i), "B had no send key at {i}");
            sim.run_ms(10);
        }
        sim.run_ms(100);
        let rekeys = sim.a.stats().rekeys + sim.b.stats().rekeys;
        assert!(
            rekeys >= 20,
            "seed {seed}: {rekeys} rekeys (both sides counted)"
        );
        for (name, g) in [("A", &sim.a), ("B", &sim.b)] {
            let got: HashSet<u64> = g.delivered().iter().copied().collect();
            assert_eq!(
                got.len() as u64,
                n,
                "seed {seed}: {name} lost packets: drops {:?}",
                g.g.drops
            );
            let bad: u64 = g
                .g
                .drops
                .iter()
                // The network duplicates packets (replays of data and handshakes), and both sides
                // initiate at start-up (one initiation ignored as simultaneous).
                .filter(|(r, _)| !matches!(**r, "open_replay" | "hs_replayed" | "hs_simultaneous"))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(bad, 0, "seed {seed}: {name} drops {:?}", g.g.drops);
        }
    }
}

#[test]
fn a_responder_that_never_initiates_is_rekeyed_when_it_has_sent_the_budget() {
    // The server role: its sessions only answer, and a download is one-way. Its client, the
    // initiator, holds the packet budget against what the server sealed too, so the server's
    // send key is replaced near `rekey_after_packets` instead of sealing on to the AEAD's limit.
    let budget = 500;
    let ka = PrivateKey::generate([0xa1; 32]);
    let kb = PrivateKey::generate([0xb2; 32]);
    let cfg = |own: &PrivateKey, peer: &PrivateKey, local, remote| {
        mt6d_proto::handshake::HandshakeConfig {
            rekey_after_packets: budget,
            ..handshake_config(own, peer, local, remote)
        }
    };
    let mut sim = Sim::new(9, CLEAN, Duration::from_secs(120));
    sim.a.g = SimGateway::new(cfg(&ka, &kb, A, B), Duration::from_secs(2));
    sim.b.g = SimGateway::responder_only(cfg(&kb, &ka, B, A), Duration::from_secs(2));
    sim.run_ms(200);
    assert!(sim.established());
    let n = 2_000u64; // 200 packets a second from B for 10 s: four budgets
    for i in 0..n {
        assert!(sim.send_data(true, i), "B had no send key at {i}");
        sim.run_ms(5);
    }
    sim.run_ms(100);
    assert!(
        sim.a.stats().rekeys >= 3,
        "rekeys: {} (A's stats {:?})",
        sim.a.stats().rekeys,
        sim.a.stats()
    );
    let got: HashSet<u64> = sim.a.delivered().iter().copied().collect();
    assert_eq!(got.len() as u64, n, "A lost packets: {:?}", sim.a.g.drops);
    // No key of B's sealed far past the budget: the check runs every 10 ms here (every second
    // in the daemon) and the new key takes over a round trip later.
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    for (key, _) in &sim.nonces {
        *per_key.entry(*key).or_default() += 1;
    }
    let most = per_key.values().max().copied().unwrap_or(0);
    assert!(
        most <= budget + 10,
        "a key sealed {most} packets: {per_key:?}"
    );
}

#[test]
fn nonces_never_repeat_across_restarts_and_traffic_recovers() {
    let rekey = Duration::from_secs(120);
    let mut sim = Sim::new(5, CLEAN, rekey);
    let ka = sim.a.private.clone();
    let kb = sim.b.private.clone();
    let mut seq = 0;
    for round in 0..5 {
        sim.run_ms(50);
        assert!(sim.established(), "round {round}");
        for _ in 0..100 {
            sim.send_data(false, seq);
            sim.send_data(true, seq);
            seq += 1;
            sim.run_ms(2);
        }
        // Restart one side (alternating), mid-stream: it forgets every key and handshake state.
        if round % 2 == 0 {
            sim.b = sim.b.restarted(&ka, B, A, rekey);
        } else {
            sim.a = sim.a.restarted(&kb, A, B, rekey);
        }
        // The side that did not restart keeps sending with its old keys: the restarted side
        // cannot open them (no key), asks for a handshake, and traffic resumes within ~1 RTT of
        // the restarted side's first initiation.
        let mut recovered_after = None;
        for t in 0..200 {
            sim.send_data(false, seq);
            sim.send_data(true, seq);
            seq += 1;
            sim.run_ms(5);
            let a_ok = sim.a.delivered().last() == Some(&(seq - 1));
            let b_ok = sim.b.delivered().last() == Some(&(seq - 1));
            if a_ok && b_ok {
                recovered_after = Some(t * 5);
                break;
            }
        }
        let ms = recovered_after.unwrap_or_else(|| panic!("round {round}: no recovery in 1 s"));
        assert!(ms <= 100, "round {round}: recovered after {ms} ms");
    }
    // Five restarts, thousands of packets, every (key, nonce) distinct (asserted on each seal).
    assert!(sim.nonces.len() > 1000);
}

#[test]
fn bogus_initiations_are_rejected_by_the_mac_before_any_diffie_hellman() {
    let mut sim = Sim::new(9, CLEAN, Duration::from_secs(120));
    sim.run_ms(50);
    assert!(sim.established());
    let now = sim.now();
    // On B's link set, where a cold start's initiations arrive.
    let set = sim.b.g.link.sets().link().clone();
    let route = Link::schedule_of(&set, now).send;
    let mut recv = ReceiveKeys::new();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..1000 {
        let mut junk = [0u8; mt6d_proto::handshake::INITIATION_LEN];
        rng.fill(&mut junk[..]);
        junk[0] = 0x81;
        junk[1..4].fill(0);
        assert_eq!(
            sim.b
                .g
                .link
                .handle_handshake(now, &set, &route, &junk, &mut recv, || Some([0; 32]))
                .unwrap_err(),
            HandshakeError::BadMac
        );
    }
    assert_eq!(
        sim.b.stats().failures_by_reason().collect::<Vec<_>>(),
        vec![("hs_bad_mac", 1000)]
    );
    // Established traffic is untouched.
    assert!(sim.send_data(false, 1));
    sim.run_ms(1);
    assert_eq!(sim.b.delivered(), [1]);
}

/// Long round trips and replays: at 1 s and 2 s round trips (each longer than the first retry
/// interval) with an attacker replaying every handshake message it saw, to the same route and
/// others, handshakes complete, rekeys happen, data flows both ways without loss, and no replay
/// earns a response (no Diffie-Hellman for the attacker).
#[test]
fn handshakes_complete_at_long_round_trips_under_a_replaying_attacker() {
    for rtt in [1000u64, 2000] {
        for seed in 0..3 {
            let net = Net {
                min_delay_ms: rtt / 2,
                max_delay_ms: rtt / 2 + 30,
                replay_attack: true,
                ..CLEAN
            };
            let mut sim = Sim::new(40 + seed, net, Duration::from_secs(15));
            let mut waited = 0;
            while !sim.established() {
                sim.run_ms(100);
                waited += 100;
                assert!(waited < 15_000, "rtt {rtt} seed {seed}: no keys after 15 s");
            }
            // 60 s of traffic, one packet each way every 20 ms: several rekeys at this round
            // trip, under the attacker.
            let n = 3_000u64;
            for i in 0..n {
                assert!(
                    sim.send_data(false, i),
                    "rtt {rtt} seed {seed}: A no key at {i}"
                );
                assert!(
                    sim.send_data(true, i),
                    "rtt {rtt} seed {seed}: B no key at {i}"
                );
                sim.run_ms(20);
            }
            sim.run_ms(rtt + 100);
            let (a, b) = (sim.a.stats().clone(), sim.b.stats().clone());
            assert!(
                a.rekeys + b.rekeys >= 3,
                "rtt {rtt} seed {seed}: {a:?} {b:?}"
            );
            for (name, g) in [("A", &sim.a), ("B", &sim.b)] {
                let got: HashSet<u64> = g.delivered().iter().copied().collect();
                assert_eq!(
                    got.len() as u64,
                    n,
                    "rtt {rtt} seed {seed}: {name} lost packets: drops {:?}",
                    g.g.drops
                );
            }
            assert!(
                a.failures_by_reason()
                    .any(|(r, n)| r == "hs_replayed" && n > 10),
                "the attacker was active: {a:?}"
            );
            // Every response answers a genuine initiation: replays cost no DH.
            assert!(b.responses_sent <= a.initiations_sent, "{a:?} {b:?}");
            assert!(a.responses_sent <= b.initiations_sent, "{a:?} {b:?}");
        }
    }
}

/// No handshake storm: forged 32-byte packets naming the empty key slot, 100 a second for 20 s,
/// start no handshake while a fresh confirmed key exists, and at most one per
/// `EMPTY_SLOT_HOLDOFF` once the keys are older than the rekey interval.
#[test]
fn forged_empty_slot_packets_cause_no_handshake_storm() {
    let mut sim = Sim::new(21, CLEAN, Duration::from_secs(120));
    sim.run_ms(100);
    assert!(sim.established());
    let before = sim.a.stats().initiations_sent + sim.b.stats().initiations_sent;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let forge = |sim: &mut Sim, rng: &mut ChaCha8Rng| {
        let now = sim.now();
        let route = sim.a.g.stream().schedule(now).send;
        let mut p = [0u8; 32];
        rng.fill(&mut p[..]);
        // The phase bit of the slot B has no key in (B's confirmed key is phase 0).
        p[0] = 0x40;
        // Masked as A would (§4.5): the worst case, an attacker holding the header key (a
        // thief of one static key can derive it); without it only a quarter of random forgeries
        // would name that slot.
        sim.a
            .g
            .stream()
            .send_header_key()
            .unwrap()
            .protect(&mut p)
            .unwrap();
        sim.in_flight.insert(
            (sim.now_ms + 1, u64::MAX - sim.now_ms),
            Datagram {
                to_b: true,
                p: Packet {
                    src: route.local,
                    dst: route.remote,
                    bytes: p.to_vec(),
                    handshake: false,
                },
            },
        );
    };
    for _ in 0..2_000 {
        forge(&mut sim, &mut rng);
        sim.run_ms(10);
    }
    let after = sim.a.stats().initiations_sent + sim.b.stats().initiations_sent;
    assert!(sim.b.g.drops.get("open_no_key").copied().unwrap_or(0) >= 1_900);
    assert_eq!(after, before, "no handshake while the keys are fresh");
    // Keys older than the rekey interval: B may ask, but at most once per hold-off.
    let mut sim = Sim::new(22, CLEAN, Duration::from_secs(2));
    sim.run_ms(100);
    assert!(sim.established());
    let start = sim.b.stats().initiations_sent + sim.a.stats().initiations_sent;
    for _ in 0..2_000 {
        forge(&mut sim, &mut rng);
        sim.run_ms(10);
    }
    let made = sim.b.stats().initiations_sent + sim.a.stats().initiations_sent - start;
    // Regular rekeys every ~2 s (10 in 20 s, and retries) plus at most 4 asked for by forgeries.
    assert!(made <= 20, "{made} initiations in 20 s");
}

/// Both gateways initiate at the same moment during a stream (a rekey race),
/// many times over: not one packet is lost.
#[test]
fn a_rekey_race_loses_no_packet() {
    for seed in 0..6 {
        let net = Net {
            max_delay_ms: 30,
            ..CLEAN
        };
        let mut sim = Sim::new(60 + seed, net, Duration::from_secs(120));
        sim.run_ms(200);
        assert!(sim.established());
        let mut seq = 0u64;
        for race in 0..20 {
            // Both timers decide to rekey in the same millisecond.
            sim.a.g.link.handle_no_send_key();
            sim.b.g.link.handle_no_send_key();
            sim.tick(false);
            sim.tick(true);
            for _ in 0..150 {
                assert!(sim.send_data(false, seq), "seed {seed} race {race}");
                assert!(sim.send_data(true, seq), "seed {seed} race {race}");
                seq += 1;
                sim.run_ms(2);
            }
        }
        sim.run_ms(100);
        for (name, g) in [("A", &sim.a), ("B", &sim.b)] {
            let got: HashSet<u64> = g.delivered().iter().copied().collect();
            assert_eq!(
                got.len() as u64,
                seq,
                "seed {seed}: {name} lost {} packets: drops {:?}",
                seq - got.len() as u64,
                g.g.drops
            );
        }
        assert!(sim.a.stats().rekeys + sim.b.stats().rekeys >= 20);
    }
}

/// A client (A, initiator) and its server (B, answers only, as the server role runs it), with
/// 60 s rekeys. The client sends a request every 100 ms and the server answers each one it
/// delivers. Returns the sim and the next sequence number, established and serving.
fn client_and_server(seed: u64, net: Net) -> (Sim, u64) {
    let rekey = Duration::from_secs(60);
    let mut sim = Sim::new(seed, net, rekey);
    let ka = sim.a.private.clone();
    sim.b = Gateway::server(sim.b.private.clone(), &ka, rekey);
    let mut seq = 0;
    for _ in 0..30 {
        seq = serve_one(&mut sim, seq);
    }
    assert!(sim.established());
    if net.loss == 0.0 {
        assert_eq!(sim.a.delivered().last(), Some(&(seq - 1)));
    }
    (sim, seq)
}

/// One request from A, answered by B if B delivered it, over 100 ms. Returns the next `seq`.
fn serve_one(sim: &mut Sim, seq: u64) -> u64 {
    sim.send_data(false, seq);
    sim.run_ms(20);
    if sim.b.delivered().last() == Some(&seq) {
        sim.send_data(true, seq);
    }
    sim.run_ms(80);
    seq + 1
}

/// Requests until one is answered; returns how long after `from_ms` the first answer came.
fn served_after(sim: &mut Sim, mut seq: u64, from_ms: u64, limit_ms: u64) -> (u64, u64) {
    while sim.now_ms < from_ms + limit_ms {
        let asked = seq;
        seq = serve_one(sim, seq);
        if sim.a.delivered().last() == Some(&asked) {
            return (sim.now_ms - from_ms, seq);
        }
    }
    panic!("not served within {limit_ms} ms of the server being back");
}

#[test]
fn a_restarted_server_serves_its_client_again_within_five_seconds() {
    // The server restarts at once, or after 2 s and 12 s down; the client never learns of it
    // but by its unanswered requests, and its rekey is a minute away.
    for (seed, down_ms) in [(21, 0), (22, 2_000), (23, 12_000)] {
        let (mut sim, mut seq) = client_and_server(seed, CLEAN);
        let ka = sim.a.private.clone();
        let kb = sim.b.private.clone();
        sim.b_down = true;
        let down_at = sim.now_ms;
        while sim.now_ms < down_at + down_ms {
            seq = serve_one(&mut sim, seq);
        }
        sim.b = Gateway::server(kb, &ka, Duration::from_secs(60));
        sim.b_down = false;
        let back = sim.now_ms;
        let (ms, next) = served_after(&mut sim, seq, back, 5_000);
        seq = next;
        assert!(ms <= 5_000, "down {down_ms} ms: served {ms} ms after");
        assert_eq!(sim.a.stats().liveness_failures, 1, "down {down_ms} ms");
        // The recovery handshake went to the link set, the one a restarted server binds.
        assert!(sim.b.stats().completed >= 1);
        // Served from then on, with no further recovery.
        for _ in 0..50 {
            let asked = seq;
            seq = serve_one(&mut sim, seq);
            assert_eq!(sim.a.delivered().last(), Some(&asked));
        }
        assert_eq!(sim.a.stats().liveness_failures, 1);
    }
}

#[test]
fn a_restarted_server_serves_its_client_again_under_loss_and_reordering() {
    let lossy = Net {
        loss: 0.05,
        dup: 0.02,
        max_delay_ms: 30,
        min_delay_ms: 5,
        replay_attack: false,
    };
    for seed in 30..40 {
        let (mut sim, seq) = client_and_server(seed, lossy);
        let ka = sim.a.private.clone();
        let kb = sim.b.private.clone();
        sim.b = Gateway::server(kb, &ka, Duration::from_secs(60));
        let back = sim.now_ms;
        // Loss takes retries: the recovery handshake's retry is at most 2.5 s.
        let (ms, _) = served_after(&mut sim, seq, back, 8_000);
        assert!(ms <= 8_000, "seed {seed}: served {ms} ms after");
    }
}

#[test]
fn a_one_way_flow_and_an_idle_link_make_no_recovery_handshake() {
    let (mut sim, mut seq) = client_and_server(40, CLEAN);
    let completed = sim.a.stats().completed;
    let sent_by_b = sim.nonces.len();
    // 30 s of requests the server never answers with data: its keepalives say it is alive.
    for _ in 0..300 {
        sim.send_data(false, seq);
        seq += 1;
        sim.run_ms(100);
    }
    assert_eq!(sim.b.delivered().last(), Some(&(seq - 1)));
    assert_eq!(sim.a.stats().liveness_failures, 0);
    assert_eq!(
        sim.a.stats().completed,
        completed,
        "no handshake in a one-way flow"
    );
    let keepalives = sim.nonces.len() - sent_by_b - 300;
    assert!(
        (10..=45).contains(&keepalives),
        "keepalives in 30 s: {keepalives}"
    );
    // Then 20 s with nothing to send (the rekey is later): nothing is sent at all.
    sim.run_ms(2_000);
    let before = sim.nonces.len();
    sim.run_ms(20_000);
    assert_eq!(sim.nonces.len(), before, "an idle link sends no keepalive");
    assert_eq!(sim.a.stats().liveness_failures, 0);
}
