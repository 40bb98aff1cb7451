//! 003's topology in simulated time (docs/PROTOCOL.md §10.8; shared/seeds/003, Appendix F: three
//! fully meshed routers, two hosts behind each, 5 ms links with 1 % loss): three relays R1, R2,
//! R3 and six edge gateways, E1/E2 behind R1, E3/E4 behind R2, E5/E6 behind R3.
//!
//! Every frame is built with the relay module's writers and read back through its checked views;
//! every link end runs a `LinkMonitor`, every node a `RoutingTable`. The link layer's encryption
//! is not simulated (it is the ordinary MT6D link, §10.2). Checked:
//! - routes converge, R1 reaches E5 directly through R3;
//! - after the R1-R3 link is cut, E1's traffic to E5 arrives through R2 within 1 s;
//! - when the link returns, it is not used before its 10 s hold time and is used again after;
//! - after every step, no routing loop towards any edge gateway;
//! - every frame on the wire has a size class, and probes share theirs with small data.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use mt6d_proto::handshake::PrivateKey;
use mt6d_proto::relay::cost::{LinkMonitor, HOLD};
use mt6d_proto::relay::e2e::E2ePayload;
use mt6d_proto::relay::frame::{DEFAULT_FRAME_MAX, FRAME_STEP, MIN_FRAME};
use mt6d_proto::relay::probe::{Probe, ProbeRepr, ProbeType};
use mt6d_proto::relay::routing::{MessageType, RoutingMessage};
use mt6d_proto::relay::table::{Forward, Neighbour, RoutingTable};
use mt6d_proto::relay::{Kind, NodeId, RelayFrame, RelayRepr, HOP_LIMIT};
use mt6d_proto::UnixTime;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const FRAME_MAX: usize = DEFAULT_FRAME_MAX;
/// 003's ns file: `duplex-link ... 5ms`, `tb-set-link-loss 0.01`.
const DELAY: Duration = Duration::from_millis(5);
const LOSS: f64 = 0.01;
const START: u64 = 1_700_000_000_000; // ms
/// Routes are checked and the link cut once the loss windows have been full for a while (256
/// probes, 12.8 s): with fewer samples, 1 % loss makes equal links' costs differ by up to a
/// hop's worth, and the 12.5 % hysteresis may keep a detour chosen early.
const CUT: u64 = 30_000;
const RESTORE: u64 = 50_000;
const END: u64 = 70_000;
/// One data packet per flow every 10 ms.
const DATA_EVERY: u64 = 10;

fn at(ms: u64) -> UnixTime {
    UnixTime::from_millis(START + ms)
}
fn ms_of(t: UnixTime) -> f64 {
    (t.as_nanos() - at(0).as_nanos()) as f64 / 1e6
}

struct Node {
    name: &'static str,
    id: NodeId,
    table: RoutingTable,
    /// Link index -> this end's monitor.
    monitors: BTreeMap<u32, LinkMonitor>,
}

struct Link {
    ends: [usize; 2],
    up: bool,
}

/// A data flow from one edge gateway to another; `small` packets are ACK-sized.
struct Flow {
    from: usize,
    to: usize,
    payload: usize,
}

#[derive(Debug, Clone)]
struct Delivery {
    flow: usize,
    sent: u64,
    arrived: UnixTime,
    path: Vec<usize>,
}

struct Sim {
    now: UnixTime,
    nodes: Vec<Node>,
    links: Vec<Link>,
    /// (arrival ns, order) -> (to node, link, bytes, packet id if data)
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    in_flight: BTreeMap<u64, (usize, u32, Vec<u8>)>,
    order: u64,
    rng: ChaCha8Rng,
    flows: Vec<Flow>,
    next_packet: u64,
    /// Packet id -> (flow, sent ms, nodes visited).
    packets: BTreeMap<u64, (usize, u64, Vec<usize>)>,
    delivered: Vec<Delivery>,
    /// Data packets a link dropped (cut, or its random loss).
    lost_on_links: BTreeSet<u64>,
    drops: BTreeMap<&'static str, u64>,
    /// Frame lengths seen on the wire, by kind.
    sizes: BTreeMap<u8, BTreeSet<usize>>,
    route_changes: u64,
    loop_checks: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut nodes = Vec::new();
        let names = ["R1", "R2", "R3", "E1", "E2", "E3", "E4", "E5", "E6"];
        for (i, name) in names.iter().enumerate() {
            let key = PrivateKey::from_bytes([u8::try_from(i).unwrap() + 1; 32]);
            let id = NodeId::from_public_key(&key.public_key()).unwrap();
            let table = if name.starts_with('R') {
                RoutingTable::relay(at(0))
            } else {
                RoutingTable::edge(at(0), id)
            };
            nodes.push(Node {
                name,
                id,
                table,
                monitors: BTreeMap::new(),
            });
        }
        // R1-R2, R1-R3, R2-R3, then each edge to its relay.
        let pairs = [
            (0, 1),
            (0, 2),
            (1, 2),
            (3, 0),
            (4, 0),
            (5, 1),
            (6, 1),
            (7, 2),
            (8, 2),
        ];
        let mut links = Vec::new();
        for (l, &(a, b)) in pairs.iter().enumerate() {
            let l = u32::try_from(l).unwrap();
            for n in [a, b] {
                nodes[n].monitors.insert(l, LinkMonitor::new(at(0)));
            }
            links.push(Link {
                ends: [a, b],
                up: true,
            });
        }
        Sim {
            now: at(0),
            nodes,
            links,
            queue: BinaryHeap::new(),
            in_flight: BTreeMap::new(),
            order: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            // E1 -> E5 full-size packets and E5 -> E1 acknowledgement-sized ones; E3 -> E6 too.
            flows: vec![
                Flow {
                    from: 3,
                    to: 7,
                    payload: 1200,
                },
                Flow {
                    from: 7,
                    to: 3,
                    payload: 60,
                },
                Flow {
                    from: 5,
                    to: 8,
                    payload: 300,
                },
            ],
            next_packet: 0,
            packets: BTreeMap::new(),
            delivered: Vec::new(),
            lost_on_links: BTreeSet::new(),
            drops: BTreeMap::new(),
            sizes: BTreeMap::new(),
            route_changes: 0,
            loop_checks: 0,
        }
    }

    fn node_index(&self, name: &str) -> usize {
        self.nodes.iter().position(|n| n.name == name).unwrap()
    }
    fn link_between(&self, a: &str, b: &str) -> u32 {
        let (a, b) = (self.node_index(a), self.node_index(b));
        let l = self
            .links
            .iter()
            .position(|l| l.ends == [a, b] || l.ends == [b, a])
            .unwrap();
        u32::try_from(l).unwrap()
    }
    fn other_end(&self, link: u32, me: usize) -> usize {
        let l = &self.links[link as usize];
        if l.ends[0] == me {
            l.ends[1]
        } else {
            l.ends[0]
        }
    }
    /// The next hop's name from `from` towards edge gateway `to`.
    fn next_hop(&self, from: &str, to: &str) -> Option<&'static str> {
        let f = self.node_index(from);
        let dest = self.nodes[self.node_index(to)].id;
        let n = self.nodes[f].table.next_hop(&dest)?;
        Some(self.nodes[self.other_end(n.0, f)].name)
    }

    fn transmit(&mut self, from: usize, link: u32, bytes: Vec<u8>) {
        self.sizes.entry(bytes[0]).or_default().insert(bytes.len());
        let l = &self.links[link as usize];
        if !l.up || self.rng.random::<f64>() < LOSS {
            if bytes[0] == Kind::Data.byte() {
                self.lost_on_links
                    .insert(u64::from_be_bytes(bytes[12..20].try_into().unwrap()));
            }
            return;
        }
        let to = self.other_end(link, from);
        let jitter = Duration::from_micros(self.rng.random_range(0..100));
        let arrive = self.now.saturating_add(DELAY + jitter).as_nanos();
        self.order += 1;
        self.queue.push(Reverse((arrive, self.order)));
        self.in_flight.insert(self.order, (to, link, bytes));
    }

    fn frame(kind: Kind, hops: u8, destination: NodeId, payload: &[u8]) -> Vec<u8> {
        let repr = RelayRepr {
            kind,
            hops,
            payload_len: u16::try_from(payload.len()).unwrap(),
            destination,
        };
        let mut buf = vec![0u8; FRAME_MAX];
        let n = repr.write_frame(payload, FRAME_MAX, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// Feeds cost changes to the table and sends what the table wants sent.
    fn pump(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let mut changes = Vec::new();
        for (&l, m) in node.monitors.iter_mut() {
            while let Some(c) = m.poll_cost_change() {
                changes.push((l, c));
            }
        }
        for (l, c) in changes {
            node.table.handle_link_cost(now, Neighbour(l), c);
        }
        let mut out = Vec::new();
        while let Some(t) = self.nodes[i].table.poll_transmit() {
            let mut body = vec![0u8; t.message.buffer_len()];
            t.message.emit(&mut body).unwrap();
            let f = Self::frame(Kind::Routing, 1, NodeId::RESERVED, &body);
            out.push((t.to.0, f));
        }
        for (l, f) in out {
            self.transmit(i, l, f);
        }
    }

    fn service(&mut self, i: usize) {
        let now = self.now;
        let links: Vec<u32> = self.nodes[i].monitors.keys().copied().collect();
        for l in links {
            let r = self.rng.random::<u32>();
            let m = self.nodes[i].monitors.get_mut(&l).unwrap();
            let mut probes = Vec::new();
            while let Some(seq) = m.poll_probe(now, r) {
                probes.push(seq);
            }
            m.handle_timeout(now);
            for seq in probes {
                let p = ProbeRepr::request(seq).to_bytes();
                let f = Self::frame(Kind::Probe, 1, NodeId::RESERVED, &p);
                self.transmit(i, l, f);
            }
        }
        if self.nodes[i].table.poll_timeout() <= now {
            self.nodes[i].table.handle_timeout(now);
        }
        self.pump(i);
    }

    fn receive(&mut self, i: usize, link: u32, mut bytes: Vec<u8>) {
        let now = self.now;
        let frame = RelayFrame::new_checked(&bytes[..]).expect("every frame we made parses");
        match frame.kind() {
            Kind::Probe => {
                let p = ProbeRepr::parse(&Probe::new_checked(frame.payload()).unwrap());
                match p.probe_type {
                    ProbeType::Request => {
                        let f =
                            Self::frame(Kind::Probe, 1, NodeId::RESERVED, &p.reply().to_bytes());
                        self.transmit(i, link, f);
                    }
                    ProbeType::Reply => {
                        let m = self.nodes[i].monitors.get_mut(&link).unwrap();
                        m.handle_reply(now, p.sequence);
                    }
                }
            }
            Kind::Routing => {
                let m = RoutingMessage::new_checked(frame.payload()).unwrap();
                let table = &mut self.nodes[i].table;
                match m.message_type() {
                    MessageType::Update => table.handle_update(now, Neighbour(link), m.updates()),
                    MessageType::Request => {
                        table.handle_request(now, Neighbour(link), m.requests())
                    }
                }
            }
            Kind::Data | Kind::E2eHandshake => {
                let repr = RelayRepr::parse(&frame);
                let id =
                    u64::from_be_bytes(E2ePayload::new_checked(frame.payload()).unwrap().tag().0);
                match self.nodes[i].table.forward(&repr, false) {
                    Forward::Deliver => {
                        let (flow, sent, mut path) = self.packets.remove(&id).unwrap();
                        assert_eq!(self.flows[flow].to, i, "delivered to the wrong edge");
                        path.push(i);
                        self.delivered.push(Delivery {
                            flow,
                            sent,
                            arrived: now,
                            path,
                        });
                    }
                    Forward::Send { to, hops } => {
                        self.packets.get_mut(&id).unwrap().2.push(i);
                        let mut f = RelayFrame::new_checked(&mut bytes[..]).unwrap();
                        f.set_hops(hops);
                        self.transmit(i, to.0, bytes);
                    }
                    Forward::Drop(d) => *self.drops.entry(d.reason()).or_default() += 1,
                }
            }
        }
        self.pump(i);
    }

    fn send_data(&mut self, flow: usize, sent_ms: u64) {
        let (from, to, len) = {
            let f = &self.flows[flow];
            (f.from, f.to, f.payload)
        };
        let id = self.next_packet;
        self.next_packet += 1;
        let mut payload = vec![0u8; len];
        payload[..8].copy_from_slice(&id.to_be_bytes());
        let dest = self.nodes[to].id;
        let f = Self::frame(Kind::Data, HOP_LIMIT, dest, &payload);
        let repr = RelayRepr::parse(&RelayFrame::new_checked(&f[..]).unwrap());
        match self.nodes[from].table.forward(&repr, true) {
            Forward::Send { to: link, hops } => {
                assert_eq!(hops, HOP_LIMIT);
                self.packets.insert(id, (flow, sent_ms, vec![from]));
                self.transmit(from, link.0, f);
            }
            Forward::Drop(_) => *self.drops.entry("source_no_route").or_default() += 1,
            Forward::Deliver => unreachable!("a flow to itself"),
        }
    }

    /// Follows next hops from every node towards every edge gateway: a revisit is a loop.
    fn check_loops(&mut self) {
        self.loop_checks += 1;
        for dest in 3..self.nodes.len() {
            let did = self.nodes[dest].id;
            for start in 0..self.nodes.len() {
                let mut seen = BTreeSet::new();
                let mut cur = start;
                let mut path = vec![self.nodes[cur].name];
                loop {
                    if cur == dest {
                        break;
                    }
                    assert!(
                        seen.insert(cur),
                        "routing loop towards {} at {:.1} ms: {path:?}",
                        self.nodes[dest].name,
                        ms_of(self.now)
                    );
                    // Edge gateways forward nothing for others: a path through one ends there.
                    if cur != start && cur >= 3 {
                        break;
                    }
                    let Some(n) = self.nodes[cur].table.next_hop(&did) else {
                        break;
                    };
                    cur = self.other_end(n.0, cur);
                    path.push(self.nodes[cur].name);
                }
            }
        }
    }

    fn next_event(&self, next_data: u64, stops: &[u64]) -> UnixTime {
        let mut t = at(next_data);
        if let Some(Reverse((ns, _))) = self.queue.peek() {
            t = t.min(UnixTime::from_nanos(*ns));
        }
        for n in &self.nodes {
            t = t.min(n.table.poll_timeout());
            for m in n.monitors.values() {
                t = t.min(m.poll_timeout());
            }
        }
        for &s in stops {
            if at(s) > self.now {
                t = t.min(at(s));
            }
        }
        t.max(self.now)
    }

    /// Runs until `until` ms, calling `each` after every step.
    fn run(&mut self, until: u64, each: &mut dyn FnMut(&mut Sim)) {
        let mut next_data = self.now.as_millis() - START;
        next_data = next_data.div_ceil(DATA_EVERY) * DATA_EVERY;
        while self.now < at(until) {
            let t = self.next_event(next_data, &[until]);
            self.now = t;
            while let Some(Reverse((ns, order))) = self.queue.peek().copied() {
                if ns > t.as_nanos() {
                    break;
                }
                self.queue.pop();
                let (to, link, bytes) = self.in_flight.remove(&order).unwrap();
                self.receive(to, link, bytes);
            }
            for i in 0..self.nodes.len() {
                self.service(i);
            }
            if at(next_data) <= t {
                if next_data >= 5_000 {
                    for f in 0..self.flows.len() {
                        self.send_data(f, next_data);
                    }
                }
                next_data += DATA_EVERY;
            }
            let changes: u64 = self
                .nodes
                .iter()
                .map(|n| n.table.stats().route_changes)
                .sum();
            if changes != self.route_changes {
                self.route_changes = changes;
                self.check_loops();
            }
            each(self);
        }
    }

    fn set_link(&mut self, a: &str, b: &str, up: bool) {
        let l = self.link_between(a, b);
        self.links[l as usize].up = up;
    }
}

/// What one run of the scenario measured.
#[derive(Debug)]
struct Outcome {
    /// When R1 (and R3) declared the cut link dead, ms after the cut.
    detected: f64,
    /// When R1's next hop to E5 became R2, ms after the cut.
    switched: f64,
    /// First E1 -> E5 packet delivered through R2, ms after the cut.
    first_detour: f64,
    /// Longest silence between E1 -> E5 deliveries around the cut, ms.
    longest_gap: f64,
    /// When R1 went back to R3 for E5, ms after the restore.
    switched_back: f64,
}

fn scenario(seed: u64) -> Outcome {
    let mut sim = Sim::new(seed);
    sim.run(CUT, &mut |_| {});

    // Converged: every node has a route to every other edge gateway.
    for n in 0..sim.nodes.len() {
        for d in 3..sim.nodes.len() {
            if n != d {
                assert!(
                    sim.nodes[n].table.route(&sim.nodes[d].id).is_some(),
                    "seed {seed}: {} has no route to {}",
                    sim.nodes[n].name,
                    sim.nodes[d].name
                );
            }
        }
    }
    assert_eq!(sim.next_hop("R1", "E5"), Some("R3"));
    assert_eq!(sim.next_hop("R3", "E1"), Some("R1"));
    assert_eq!(sim.next_hop("E1", "E5"), Some("R1"));
    let (e1, r1, r2, r3, e5) = (3, 0, 1, 2, 7);
    let direct = sim
        .delivered
        .iter()
        .rev()
        .find(|d| d.flow == 0)
        .unwrap()
        .path
        .clone();
    assert_eq!(direct, vec![e1, r1, r3, e5]);

    sim.set_link("R1", "R3", false);
    let r1r3 = sim.link_between("R1", "R3");
    let mut detected = None;
    let mut switched = None;
    sim.run(CUT + 5_000, &mut |s| {
        let now = ms_of(s.now) - CUT as f64;
        if detected.is_none() && !s.nodes[0].monitors[&r1r3].cost().is_finite() {
            detected = Some(now);
        }
        if switched.is_none() && s.next_hop("R1", "E5") == Some("R2") {
            switched = Some(now);
        }
    });
    let detected = detected.expect("the cut link is declared dead");
    let switched = switched.expect("R1 moves to R2");
    let first_detour = sim
        .delivered
        .iter()
        .filter(|d| d.flow == 0 && d.sent >= CUT && d.path == [e1, r1, r2, r3, e5])
        .map(|d| ms_of(d.arrived) - CUT as f64)
        .fold(f64::INFINITY, f64::min);
    let mut arrivals: Vec<f64> = sim
        .delivered
        .iter()
        .filter(|d| d.flow == 0)
        .map(|d| ms_of(d.arrived))
        .filter(|&a| a >= CUT as f64 - 500.0)
        .collect();
    arrivals.sort_by(f64::total_cmp);
    let longest_gap = arrivals.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    assert!(
        first_detour < 1000.0,
        "seed {seed}: first packet through R2 {first_detour:.1} ms after the cut"
    );
    assert!(switched < 1000.0, "seed {seed}: switched at {switched:.1}");
    assert!(longest_gap < 1000.0, "seed {seed}: gap {longest_gap:.1} ms");
    // Nothing sent from a second after the cut is lost but to the links' own 1 % loss, and all
    // of it takes the detour (packets of the last 100 ms may still be in flight).
    let window = CUT + 1_000..CUT + 4_900;
    let sent_after: Vec<&Delivery> = sim
        .delivered
        .iter()
        .filter(|d| d.flow == 0 && window.contains(&d.sent))
        .collect();
    let lost = sim
        .packets
        .iter()
        .filter(|(_, (flow, sent, _))| *flow == 0 && window.contains(sent))
        .inspect(|(id, p)| assert!(sim.lost_on_links.contains(id), "seed {seed}: {p:?}"))
        .count();
    assert_eq!(
        sent_after.len() + lost,
        usize::try_from((window.end - window.start) / DATA_EVERY).unwrap()
    );
    assert!(sent_after.iter().all(|d| d.path == [e1, r1, r2, r3, e5]));

    // The link returns: not used before the hold time is over, used again after.
    sim.run(RESTORE, &mut |_| {});
    sim.set_link("R1", "R3", true);
    let hold = HOLD.as_millis() as f64;
    let mut switched_back = None;
    sim.run(RESTORE + 16_000, &mut |s| {
        let now = ms_of(s.now) - RESTORE as f64;
        let hop = s.next_hop("R1", "E5");
        if now < hold {
            assert_eq!(
                hop,
                Some("R2"),
                "seed {seed}: back at {now:.1} ms, before the hold"
            );
        }
        if switched_back.is_none() && hop == Some("R3") {
            switched_back = Some(now);
        }
    });
    // At the end of the hold the penalty goes; R1 moves back as soon as the direct path is more
    // than 1/8 cheaper, which a fresh loss window at 1 % loss can delay by a few seconds (5 losses
    // in 64 probes cost as much as 39 ms of RTT).
    let switched_back = switched_back.expect("R1 returns to R3");
    assert!(
        switched_back >= hold && switched_back < hold + 5_000.0,
        "seed {seed}: back at {switched_back:.1} ms"
    );
    sim.run(END, &mut |_| {});
    let last = sim.delivered.iter().rev().find(|d| d.flow == 0).unwrap();
    assert_eq!(last.path, vec![e1, r1, r3, e5], "seed {seed}");
    assert_eq!(sim.next_hop("R3", "E1"), Some("R1"));

    // Probes and small data share the smallest size class; every frame has a class.
    let probe_sizes = &sim.sizes[&Kind::Probe.byte()];
    assert_eq!(
        probe_sizes.iter().copied().collect::<Vec<_>>(),
        vec![MIN_FRAME]
    );
    assert!(sim.sizes[&Kind::Data.byte()].contains(&MIN_FRAME));
    for (kind, sizes) in &sim.sizes {
        for &s in sizes {
            assert!(
                s == FRAME_MAX || (s >= MIN_FRAME && s % FRAME_STEP == 0),
                "kind {kind}: {s} bytes"
            );
        }
    }
    assert!(
        !sim.drops.contains_key("relay_hop_limit"),
        "{:?}",
        sim.drops
    );
    assert!(sim.loop_checks > 10, "routes changed and were checked");
    // Only the cut link ever looked dead, once from each end: no false verdict at 1 % loss.
    for n in &sim.nodes {
        for (&l, m) in &n.monitors {
            let want = u64::from(l == r1r3);
            assert_eq!(m.stats().deaths, want, "seed {seed}: {} link {l}", n.name);
        }
    }
    Outcome {
        detected,
        switched,
        first_detour,
        longest_gap,
        switched_back,
    }
}

#[test]
fn three_meshed_relays_fail_over_within_a_second_and_return_after_the_hold() {
    // 3 seeds here (3 s each in a debug build); 100 seeds were run in release while tuning:
    // switched 363-770 ms (median 408), longest gap 375-795 ms, back 10.01-10.10 s after the
    // restore (docs/RELAYS.md, "Failover budget").
    for seed in 1..=3 {
        let o = scenario(seed);
        eprintln!("seed {seed}: {o:?}");
        assert!(o.detected <= o.switched);
        assert!(o.switched <= o.first_detour && o.first_detour < 1000.0);
        assert!(o.longest_gap < 1000.0);
        assert!(o.switched_back >= HOLD.as_millis() as f64);
    }
}
