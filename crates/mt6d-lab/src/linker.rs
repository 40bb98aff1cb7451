//! The linker: a passive observer's attempt to tie consecutive epochs of one conversation
//! together, method by method, scored against ground truth.
//!
//! MT6D promises that an observer of the public link cannot tell that two epochs belong to one
//! conversation (docs/PROTOCOL.md §9.6, docs/PRIVACY.md). This module is the project's own
//! attempt to break that promise, kept as test support so that the promise is measured on every
//! run instead of checked by hand once. It is part of the lab and never imported by a gateway.
//!
//! Input: a capture of the public link (a pcap file, e.g. the one `mt6d demo --pcap` or the
//! observer writes) and the ground truth the test knows from the daemons' status: which outer
//! (address, port) pair carried which stream in which epoch. The linker groups UDP packets into
//! *flows* (one per unordered outer endpoint pair, which is one epoch of one stream), and for
//! every flow of epoch e that has a successor of the same stream in epoch e+1 each [`Method`]
//! picks, among all flows of epoch e+1 (the true successor and the other conversations' flows:
//! the decoys), the one it scores highest. The stream labels are never shown to a method.
//!
//! A method that cannot tell the candidates apart (all scores equal) is credited 1/k for a
//! k-way tie that includes the true successor: exactly chance, with no coin to flip and no
//! variance from tie-breaking. [`MethodResult::recovered`] is the fraction of true links
//! recovered this way; [`MethodResult::chance`] what guessing recovers.
//!
//! The methods, as docs/PRIVACY.md lists them: every outer header field,
//! the first 8 bytes of the tunnel payload read as a counter (continuation across the switch),
//! the first payload byte, packet sizes at the switch, and four side channels that name
//! addresses of two epochs in one message: neighbour discovery (001 §4.2's "oracle"),
//! redirects, MLD reports (solicited-node groups name the low 24 bits of an address, RFC 4291
//! §2.7.1) and ICMPv6 errors (outer addresses plus the quoted packet's, RFC 4443 §2.4(c));
//! the daemon's own control messages ([`Method::CONTROL`]); and traffic analysis
//! ([`Method::TRAFFIC`], in `traffic.rs`): volume, sizes, a periodic sender's phase, gaps and
//! burstiness, the packets at a unit's edges, and a k-nearest-neighbours classifier over all
//! of them (`classifier.rs`) trained on another capture. The joint assignment is in
//! `matching.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv6Addr, SocketAddrV6};

mod classifier;
mod matching;
mod method;
mod pcap;
mod traffic;

pub use classifier::{Classifier, Example};
use matching::matching_credit;
pub use method::Method;
pub use pcap::{parse_pcap, read_pcap, Frame, LinkerError};

/// Which conversation (stream) and epoch an outer route belongs to: the ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    pub stream: usize,
    pub epoch: u64,
}

/// An unordered pair of outer endpoints: one epoch of one stream on the wire.
pub type FlowKey = (SocketAddrV6, SocketAddrV6);

/// Orders a pair so that both directions of a flow have one key.
pub fn flow_key(a: SocketAddrV6, b: SocketAddrV6) -> FlowKey {
    if (a.ip(), a.port()) <= (b.ip(), b.port()) {
        (a, b)
    } else {
        (b, a)
    }
}

/// The ground truth: outer routes by flow key.
#[derive(Debug, Clone, Default)]
pub struct Truth {
    pub routes: HashMap<FlowKey, Label>,
}

/// One route of the ground truth as written to and read from a file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TruthRoute {
    pub a: SocketAddrV6,
    pub b: SocketAddrV6,
    pub stream: usize,
    pub epoch: u64,
}

impl Truth {
    /// The routes, sorted by epoch and stream, for a file beside the capture.
    pub fn to_routes(&self) -> Vec<TruthRoute> {
        let mut v: Vec<TruthRoute> = self
            .routes
            .iter()
            .map(|(k, l)| TruthRoute {
                a: k.0,
                b: k.1,
                stream: l.stream,
                epoch: l.epoch,
            })
            .collect();
        v.sort_by_key(|r| (r.epoch, r.stream));
        v
    }

    pub fn from_routes(routes: &[TruthRoute]) -> Truth {
        let mut t = Truth::default();
        for r in routes {
            t.add(
                r.a,
                r.b,
                Label {
                    stream: r.stream,
                    epoch: r.epoch,
                },
            );
        }
        t
    }

    /// Distinct epochs the truth knows.
    pub fn epochs(&self) -> usize {
        let epochs: BTreeSet<u64> = self.routes.values().map(|l| l.epoch).collect();
        epochs.len()
    }

    /// Records that `local` <-> `remote` carried `label`.
    pub fn add(&mut self, local: SocketAddrV6, remote: SocketAddrV6, label: Label) {
        self.routes.insert(flow_key(local, remote), label);
    }
}

/// Packets kept at each end of a flow for [`Method::PacketSizes`].
const EDGE_PACKETS: usize = 16;

/// Largest tunnel payload taken for a control message: keepalives (24 bytes), route move
/// notices and link-layer announcements (32). The smallest data payload is 64 bytes (counter,
/// inner IPv6 header, tag).
pub const CONTROL_PAYLOAD: usize = 40;

/// What kind of control message, as an observer tells them apart: a small tunnel payload, or
/// an ICMPv6 type (neighbour solicitation 135, advertisement 136).
type ControlKind = u8;
const KIND_TUNNEL: ControlKind = 0;

/// One direction of a flow: what its sender put in the headers and the payload's first bytes.
#[derive(Debug, Clone, Default)]
struct Direction {
    endpoint: Option<SocketAddrV6>,
    flow_labels: BTreeSet<u32>,
    traffic_classes: BTreeSet<u8>,
    hop_limits: BTreeSet<u8>,
    payload_lengths: BTreeMap<u16, u32>,
    first_bytes: BTreeMap<u8, u32>,
    /// (offset, 16-bit word) of the first 32 payload bytes, from the first packets.
    words: BTreeSet<(u8, u16)>,
    /// Smallest and largest counter seen (reordering moves the first and last packets).
    counter_min: Option<u64>,
    counter_max: Option<u64>,
    first_sizes: Vec<u32>,
    first_ts: f64,
    last_ts: f64,
    last_sizes: std::collections::VecDeque<u32>,
    /// The first 16 bytes of every payload, for [`Method::Repeats`].
    heads: BTreeSet<u128>,
    /// Every packet's (capture time, wire length), reduced to `traffic` once the capture is
    /// read.
    packets: Vec<(f64, u32)>,
    traffic: traffic::Features,
}

/// Who sent a packet, as an observer on the link tells gateways apart: the Ethernet source
/// and the /64 of the outer source. It separates the two gateways, not their conversations.
type Sender = ([u8; 6], [u8; 8]);

#[derive(Debug, Clone, Default)]
struct Flow {
    directions: BTreeMap<Sender, Direction>,
    /// Capture time of the flow's first packet.
    first_seen: f64,
}

/// The IPv6 header fields the linker reads, from a checked slice of one frame.
struct Ip6<'a> {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    flow_label: u32,
    traffic_class: u8,
    hop_limit: u8,
    payload_len: u16,
    /// Upper-layer protocol after at most one hop-by-hop header (MLD reports carry one).
    protocol: u8,
    upper: &'a [u8],
}

fn addr(b: &[u8]) -> Option<Ipv6Addr> {
    let o: [u8; 16] = b.get(..16)?.try_into().ok()?;
    Some(Ipv6Addr::from(o))
}

fn parse_ip6(frame: &[u8]) -> Option<Ip6<'_>> {
    if frame.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let ip = frame.get(14..54)?;
    if ip[0] >> 4 != 6 {
        return None;
    }
    let mut protocol = ip[6];
    let mut upper = frame.get(54..)?;
    if protocol == 0 {
        // Hop-by-hop options (RFC 8200 §4.3): length in 8-octet units, not counting the first.
        let len = (usize::from(*upper.get(1)?) + 1) * 8;
        protocol = *upper.first()?;
        upper = upper.get(len..)?;
    }
    Some(Ip6 {
        traffic_class: (ip[0] << 4) | (ip[1] >> 4),
        flow_label: u32::from_be_bytes([0, ip[1] & 0x0f, ip[2], ip[3]]),
        payload_len: u16::from_be_bytes([ip[4], ip[5]]),
        hop_limit: ip[7],
        src: addr(&ip[8..24])?,
        dst: addr(&ip[24..40])?,
        protocol,
        upper,
    })
}

/// A message that names several addresses: the side channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Named {
    Addr(Ipv6Addr),
    /// A solicited-node group names the low 24 bits of an address.
    Low24(u32),
}

fn low24(a: Ipv6Addr) -> u32 {
    let o = a.octets();
    u32::from_be_bytes([0, o[13], o[14], o[15]])
}

/// Addresses worth naming: global unicast (not unspecified, link-local or multicast), and
/// solicited-node multicast groups (ff02::1:ffXX:XXXX) as the 24 bits they name.
fn named(a: Ipv6Addr) -> Option<Named> {
    let s = a.segments();
    if s[0] == 0xff02 && s[5] == 1 && s[6] >> 8 == 0xff {
        return Some(Named::Low24(low24(a)));
    }
    if a.is_unspecified() || a.is_multicast() || (s[0] & 0xffc0) == 0xfe80 || a.is_loopback() {
        return None;
    }
    Some(Named::Addr(a))
}

/// Which side-channel method an ICMPv6 message feeds, by type (RFC 4443, 4861, 2710, 3810).
fn side_channel(icmp_type: u8) -> Option<Method> {
    match icmp_type {
        1..=4 => Some(Method::IcmpErrors),
        133..=136 => Some(Method::NeighborDiscovery),
        137 => Some(Method::Redirects),
        130..=132 | 143 => Some(Method::MldReports),
        _ => None,
    }
}

/// Everything an ICMPv6 message names: outer addresses, the ND target (and a redirect's
/// destination), MLD multicast addresses, and an error's quoted addresses.
fn icmp_names(ip: &Ip6<'_>, names: &mut Vec<Named>) {
    names.extend([ip.src, ip.dst].into_iter().filter_map(named));
    let m = ip.upper;
    let Some(&t) = m.first() else { return };
    let mut at = |off: usize| {
        if let Some(a) = m.get(off..).and_then(addr) {
            names.extend(named(a));
        }
    };
    match t {
        // Errors quote the invoking packet from byte 8: its source at 16, destination at 32.
        1..=4 => {
            at(16);
            at(32);
        }
        135 | 136 => at(8),
        137 => {
            at(8);
            at(24);
        }
        130..=132 => at(8),
        143 => {
            // MLDv2 report: records from byte 8, each 4 + 16 + 16*sources + 4*aux bytes.
            let count = m.get(6..8).map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
            let mut off = 8;
            for _ in 0..count {
                let Some(rec) = m.get(off..off + 4) else {
                    break;
                };
                at(off + 4);
                let sources = usize::from(u16::from_be_bytes([rec[2], rec[3]]));
                off += 20 + 16 * sources + 4 * usize::from(rec[1]);
            }
        }
        _ => {}
    }
}

/// A capture reduced to flows and side-channel messages.
#[derive(Debug, Default)]
pub struct Capture {
    flows: HashMap<FlowKey, Flow>,
    /// Per side-channel method, the named addresses of each message.
    messages: BTreeMap<Method, Vec<(f64, Vec<Named>)>>,
    /// Control messages: (time, kind, sender's Ethernet source, the flow it travelled on or
    /// the addresses it names).
    control: Vec<(f64, ControlKind, [u8; 6], ControlOn)>,
    /// First 8 payload bytes seen so far, and how many payloads repeated one byte for byte.
    seen_headers: std::collections::HashSet<u64>,
    pub repeated_headers: usize,
    pub frames: usize,
    pub udp_frames: usize,
}

/// What a control message belongs to.
#[derive(Debug, Clone)]
enum ControlOn {
    Flow(FlowKey),
    Names(Vec<Named>),
}

/// Which frames of a capture an observer is taken to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vantage {
    /// Everything on the captured link.
    OnLink,
    /// Only packets whose outer source is in this /64: on the far side of a router, what
    /// crossed it from the gateway behind that prefix.
    PastRouter { from_prefix: Ipv6Addr },
}

impl Vantage {
    fn sees(self, src: Ipv6Addr) -> bool {
        match self {
            Vantage::OnLink => true,
            Vantage::PastRouter { from_prefix } => src.octets()[..8] == from_prefix.octets()[..8],
        }
    }
}

impl Capture {
    /// Reduces `frames` to what `vantage` sees.
    pub fn new(frames: &[Frame], vantage: Vantage) -> Capture {
        let mut c = Capture::default();
        for f in frames {
            c.frames += 1;
            let Some(ip) = parse_ip6(&f.bytes) else {
                continue;
            };
            if !vantage.sees(ip.src) {
                continue;
            }
            match ip.protocol {
                17 => c.add_udp(f, &ip),
                58 => {
                    let method = ip.upper.first().copied().and_then(side_channel);
                    if let Some(method) = method {
                        let mut names = Vec::new();
                        icmp_names(&ip, &mut names);
                        let t = ip.upper[0];
                        if matches!(t, 135 | 136) {
                            c.control.push((
                                f.ts,
                                t,
                                sender_mac(f),
                                ControlOn::Names(names.clone()),
                            ));
                        }
                        c.messages.entry(method).or_default().push((f.ts, names));
                    }
                }
                _ => {}
            }
        }
        for d in c.flows.values_mut().flat_map(|f| f.directions.values_mut()) {
            d.traffic = traffic::Features::new(&std::mem::take(&mut d.packets));
        }
        c
    }

    fn add_udp(&mut self, f: &Frame, ip: &Ip6<'_>) {
        let Some(udp) = ip.upper.get(..8) else { return };
        self.udp_frames += 1;
        let sport = u16::from_be_bytes([udp[0], udp[1]]);
        let dport = u16::from_be_bytes([udp[2], udp[3]]);
        let src = SocketAddrV6::new(ip.src, sport, 0, 0);
        let dst = SocketAddrV6::new(ip.dst, dport, 0, 0);
        let mac = sender_mac(f);
        let payload = &ip.upper[8..];
        if let Some(h) = payload.get(..8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(h);
            if !self.seen_headers.insert(u64::from_be_bytes(b)) {
                self.repeated_headers += 1;
            }
        }
        if !payload.is_empty() && payload.len() <= CONTROL_PAYLOAD {
            self.control
                .push((f.ts, KIND_TUNNEL, mac, ControlOn::Flow(flow_key(src, dst))));
        }
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&ip.src.octets()[..8]);
        let flow = self
            .flows
            .entry(flow_key(src, dst))
            .or_insert_with(|| Flow {
                directions: BTreeMap::new(),
                first_seen: f.ts,
            });
        flow.first_seen = flow.first_seen.min(f.ts);
        let d = flow.directions.entry((mac, prefix)).or_default();
        if d.endpoint.is_none() {
            d.first_ts = f.ts;
        }
        d.first_ts = d.first_ts.min(f.ts);
        d.last_ts = d.last_ts.max(f.ts);
        d.endpoint = Some(src);
        d.flow_labels.insert(ip.flow_label);
        d.traffic_classes.insert(ip.traffic_class);
        d.hop_limits.insert(ip.hop_limit);
        *d.payload_lengths.entry(ip.payload_len).or_default() += 1;
        if let Some(h) = payload.get(..16) {
            let mut b = [0u8; 16];
            b.copy_from_slice(h);
            d.heads.insert(u128::from_be_bytes(b));
        }
        if let Some(&b) = payload.first() {
            *d.first_bytes.entry(b).or_default() += 1;
        }
        if d.first_sizes.len() < EDGE_PACKETS {
            for (i, w) in payload.chunks_exact(2).take(16).enumerate() {
                d.words.insert((i as u8, u16::from_be_bytes([w[0], w[1]])));
            }
        }
        if let Some(c) = payload.get(..8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            let v = u64::from_be_bytes(b);
            d.counter_min = Some(d.counter_min.map_or(v, |m| m.min(v)));
            d.counter_max = Some(d.counter_max.map_or(v, |m| m.max(v)));
        }
        if d.first_sizes.len() < EDGE_PACKETS {
            d.first_sizes.push(f.wire_len);
        }
        d.last_sizes.push_back(f.wire_len);
        if d.last_sizes.len() > EDGE_PACKETS {
            d.last_sizes.pop_front();
        }
        d.packets.push((f.ts, f.wire_len));
    }
}

/// The Ethernet source of a frame `parse_ip6` accepted (so at least 54 bytes long).
fn sender_mac(f: &Frame) -> [u8; 6] {
    let mut mac = [0u8; 6];
    if let Some(m) = f.bytes.get(6..12) {
        mac.copy_from_slice(m);
    }
    mac
}

fn jaccard<T: Ord>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// 1 - total variation distance between two histograms: 1 when they are the same shape.
fn overlap<T: Ord>(a: &BTreeMap<T, u32>, b: &BTreeMap<T, u32>) -> f64 {
    let (na, nb) = (
        a.values().map(|&v| f64::from(v)).sum::<f64>(),
        b.values().map(|&v| f64::from(v)).sum::<f64>(),
    );
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    a.iter()
        .filter_map(|(k, &va)| {
            b.get(k)
                .map(|&vb| (f64::from(va) / na).min(f64::from(vb) / nb))
        })
        .sum()
}

fn multiset_overlap(a: impl Iterator<Item = u32>, b: &[u32]) -> f64 {
    let mut hb: BTreeMap<u32, u32> = BTreeMap::new();
    for &x in b {
        *hb.entry(x).or_default() += 1;
    }
    let mut ha: BTreeMap<u32, u32> = BTreeMap::new();
    for x in a {
        *ha.entry(x).or_default() += 1;
    }
    overlap(&ha, &hb)
}

fn iid(a: SocketAddrV6) -> u64 {
    let o = a.ip().octets();
    let mut b = [0u8; 8];
    b.copy_from_slice(&o[8..]);
    u64::from_be_bytes(b)
}

/// The score of one direction pair (same sender in both epochs) under a header method.
fn score_direction(m: Method, a: &Direction, b: &Direction) -> Option<f64> {
    Some(match m {
        Method::FlowLabel => jaccard(&a.flow_labels, &b.flow_labels),
        Method::TrafficClass => jaccard(&a.traffic_classes, &b.traffic_classes),
        Method::HopLimit => jaccard(&a.hop_limits, &b.hop_limits),
        Method::PayloadLength => overlap(&a.payload_lengths, &b.payload_lengths),
        Method::UdpPorts => f64::from(u8::from(a.endpoint?.port() == b.endpoint?.port())),
        Method::IidBits => f64::from(64 - (iid(a.endpoint?) ^ iid(b.endpoint?)).count_ones()),
        Method::Counter => {
            // The closer the next epoch's smallest counter is to just after the previous
            // epoch's largest, the likelier the same sender's counter runs on. A counter only
            // grows (PROTOCOL §4.3), so a candidate that starts at or below the previous
            // epoch's largest value is ranked below every one that could continue it.
            let d = i128::from(b.counter_min?) - i128::from(a.counter_max?) - 1;
            let distance = d.unsigned_abs() as f64;
            if d >= 0 {
                -distance
            } else {
                -2f64.powi(80) - distance
            }
        }
        Method::FirstByte => overlap(&a.first_bytes, &b.first_bytes),
        Method::PayloadWords => jaccard(&a.words, &b.words),
        Method::PacketSizes => multiset_overlap(a.last_sizes.iter().copied(), &b.first_sizes),
        Method::Handover => -(b.first_ts - a.last_ts).abs(),
        Method::Repeats => a.heads.intersection(&b.heads).count() as f64,
        Method::Bytes
        | Method::Packets
        | Method::SizeDistribution
        | Method::TimingPhase
        | Method::SwitchGap
        | Method::Burstiness
        | Method::EdgeShape => return traffic::score(m, &a.traffic, &b.traffic),
        Method::NeighborDiscovery
        | Method::Redirects
        | Method::MldReports
        | Method::IcmpErrors
        | Method::ControlOrder
        | Method::ControlOffset
        | Method::Classifier => return None,
    })
}

/// One flow's control messages: (place, offset) by (kind, sender), see [`control_places`].
type ControlPlaces = BTreeMap<(ControlKind, [u8; 6]), (f64, f64)>;

/// Each labelled flow's control messages, by (kind, sender): the place of its first one among
/// the flows of its epoch that got one of that kind from that sender (0 for the first), and its
/// time from the epoch's anchor (the first packet of any flow of the epoch, about the
/// boundary). Only the first message of a flow counts, so a re-sent one does not move places.
fn control_places(
    capture: &Capture,
    labeled: &[(&FlowKey, &Flow, Label)],
    by_epoch: &BTreeMap<u64, Vec<usize>>,
    by_addr: &HashMap<Named, Vec<usize>>,
) -> HashMap<usize, ControlPlaces> {
    let index: HashMap<&FlowKey, usize> = labeled
        .iter()
        .enumerate()
        .map(|(i, (k, _, _))| (*k, i))
        .collect();
    let anchor: BTreeMap<u64, f64> = by_epoch
        .iter()
        .map(|(e, flows)| {
            let first = flows
                .iter()
                .map(|&f| labeled[f].1.first_seen)
                .fold(f64::INFINITY, f64::min);
            (*e, first)
        })
        .collect();
    // (epoch, kind, sender) -> (time, flow) of every message.
    type Series = BTreeMap<(u64, ControlKind, [u8; 6]), Vec<(f64, usize)>>;
    let mut series = Series::new();
    for (ts, kind, sender, on) in &capture.control {
        let flows: BTreeSet<usize> = match on {
            ControlOn::Flow(k) => index.get(k).copied().into_iter().collect(),
            ControlOn::Names(names) => names
                .iter()
                .filter_map(|n| by_addr.get(n))
                .flatten()
                .copied()
                .collect(),
        };
        for f in flows {
            series
                .entry((labeled[f].2.epoch, *kind, *sender))
                .or_default()
                .push((*ts, f));
        }
    }
    let mut places: HashMap<usize, ControlPlaces> = HashMap::new();
    for ((e, kind, sender), mut msgs) in series {
        msgs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut place = 0u32;
        for (ts, f) in msgs {
            let entry = places.entry(f).or_default();
            if let std::collections::btree_map::Entry::Vacant(v) = entry.entry((kind, sender)) {
                v.insert((f64::from(place), ts - anchor.get(&e).copied().unwrap_or(ts)));
                place += 1;
            }
        }
    }
    places
}

fn flow_addresses(key: &FlowKey) -> [Ipv6Addr; 2] {
    [*key.0.ip(), *key.1.ip()]
}

/// How one method fared against the ground truth.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MethodResult {
    pub method: &'static str,
    /// True consecutive-epoch links (a flow of epoch e whose stream has a flow in e+1).
    pub links: usize,
    /// Fraction of those links the method recovered (ties credited 1/k).
    pub recovered: f64,
    /// Fraction recovered when each epoch's flows are paired with the next epoch's jointly
    /// (the assignment with the best total score; tied assignments credited in proportion):
    /// a method that prefers one candidate for every flow cannot score here by luck.
    pub matched: f64,
    /// What picking at random among the candidates recovers.
    pub chance: f64,
    /// Links where the method preferred one candidate (no tie).
    pub decisive: usize,
    /// Of the decisive picks, the fraction that were right (None when none was decisive).
    pub precision: Option<f64>,
}

/// What the linker found in one capture.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkReport {
    /// Where the capture was taken (free text for the table).
    pub vantage: String,
    pub frames: usize,
    pub udp_frames: usize,
    /// Flows matched to a stream and epoch by the ground truth.
    pub labeled_flows: usize,
    /// Flows the ground truth does not know (none expected).
    pub unlabeled_flows: usize,
    /// Side-channel messages seen, by method.
    pub side_channel_messages: BTreeMap<&'static str, usize>,
    /// Flows whose address a side-channel message named before the flow's first tunnel packet
    /// (an address announced early: a duplicate-address probe, priming, an MLD join).
    pub flows_named_early: usize,
    /// The longest such lead, in seconds.
    pub longest_lead_secs: f64,
    /// Tunnel payloads whose first 8 bytes repeat an earlier payload's byte for byte (the
    /// header-protected bytes of a fresh message never repeat by chance).
    pub repeated_headers: usize,
    pub results: Vec<MethodResult>,
}

impl LinkReport {
    pub fn result(&self, m: Method) -> Option<&MethodResult> {
        self.results.iter().find(|r| r.method == m.name())
    }

    /// The methods that link better than chance plus `margin` flow by flow, or plus
    /// `joint_margin` jointly (one decision per epoch instead of one per flow: fewer, so
    /// guessing strays further from chance).
    pub fn linking(&self, margin: f64, joint_margin: f64) -> Vec<&MethodResult> {
        self.results
            .iter()
            .filter(|r| {
                r.links > 0
                    && (r.recovered > r.chance + margin || r.matched > r.chance + joint_margin)
            })
            .collect()
    }

    /// A Markdown table, one row per method.
    pub fn table(&self) -> String {
        let mut t = format!(
            "{}: {} frames ({} UDP), {} flows labelled by the ground truth, {} not; {} flows' \
addresses named by a side channel before their first packet (up to {:.2} s ahead); {} tunnel \
payloads repeat an earlier one's first 8 bytes\n\n\
| method | links | recovered | jointly | chance | decisive | precision |\n|---|---|---|---|---|---|---|\n",
            self.vantage,
            self.frames,
            self.udp_frames,
            self.labeled_flows,
            self.unlabeled_flows,
            self.flows_named_early,
            self.longest_lead_secs,
            self.repeated_headers
        );
        for r in &self.results {
            t += &format!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
                r.method,
                r.links,
                r.recovered,
                r.matched,
                r.chance,
                r.decisive,
                r.precision.map_or("-".into(), |p| format!("{p:.2}"))
            );
        }
        t
    }
}

/// Runs every method over `capture` against `truth`.
pub fn link(capture: &Capture, truth: &Truth, vantage: &str) -> LinkReport {
    link_with(capture, truth, vantage, None)
}

/// Runs every method over `capture` against `truth`, and the classifier if one is given
/// (trained on another capture: training on this one would score what it memorised).
pub fn link_with(
    capture: &Capture,
    truth: &Truth,
    vantage: &str,
    classifier: Option<&Classifier>,
) -> LinkReport {
    let scorer = Scorer::new(capture, truth, classifier);
    let results = Method::ALL
        .into_iter()
        .filter(|&m| m != Method::Classifier || classifier.is_some())
        .map(|m| scorer.evaluate(m))
        .collect();
    LinkReport {
        vantage: vantage.to_string(),
        frames: capture.frames,
        udp_frames: capture.udp_frames,
        labeled_flows: scorer.labeled.len(),
        unlabeled_flows: capture.flows.len() - scorer.labeled.len(),
        flows_named_early: scorer.lead.len(),
        longest_lead_secs: scorer.lead.values().copied().fold(0.0, f64::max),
        repeated_headers: capture.repeated_headers,
        side_channel_messages: capture
            .messages
            .iter()
            .map(|(m, v)| (m.name(), v.len()))
            .collect(),
        results,
    }
}

/// Labelled pairs of `capture` for training a classifier: every true pair and a few decoys of
/// each, with the scores of the methods the classifier reads as their features.
pub fn training_examples(capture: &Capture, truth: &Truth, seed: u64) -> Vec<Example> {
    let scorer = Scorer::new(capture, truth, None);
    let (mut truths, mut decoys) = (Vec::new(), Vec::new());
    for (a, truth_b, candidates) in scorer.true_links() {
        truths.push(scorer.example(a, truth_b, true));
        decoys.push(
            candidates
                .iter()
                .filter(|&&b| b != truth_b)
                .map(|&b| scorer.example(a, b, false))
                .collect(),
        );
    }
    classifier::sample(truths, decoys, seed)
}

/// A capture's labelled flows and what every method needs to score a pair of them.
struct Scorer<'c> {
    labeled: Vec<(&'c FlowKey, &'c Flow, Label)>,
    by_epoch: BTreeMap<u64, Vec<usize>>,
    /// Side-channel messages naming addresses of both flows of a pair, by method.
    pairs: HashMap<(Method, usize, usize), u32>,
    /// How long before its first tunnel packet a flow's address was named by a side channel.
    lead: HashMap<usize, f64>,
    control: HashMap<usize, ControlPlaces>,
    /// The classifier's score of every pair of consecutive epochs, computed once.
    classified: HashMap<(usize, usize), f64>,
}

impl<'c> Scorer<'c> {
    fn new(capture: &'c Capture, truth: &Truth, classifier: Option<&Classifier>) -> Scorer<'c> {
        let mut labeled: Vec<(&FlowKey, &Flow, Label)> = capture
            .flows
            .iter()
            .filter_map(|(k, f)| truth.routes.get(k).map(|l| (k, f, *l)))
            .collect();
        // A fixed order (the hashed addresses: unrelated to the stream) so that a capture
        // always gives the same figures.
        labeled.sort_by_key(|(k, _, _)| **k);
        let mut by_epoch: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, (_, _, l)) in labeled.iter().enumerate() {
            by_epoch.entry(l.epoch).or_default().push(i);
        }
        let mut by_addr: HashMap<Named, Vec<usize>> = HashMap::new();
        for (i, (k, _, _)) in labeled.iter().enumerate() {
            for a in flow_addresses(k) {
                by_addr.entry(Named::Addr(a)).or_default().push(i);
                by_addr.entry(Named::Low24(low24(a))).or_default().push(i);
            }
        }
        let (pairs, lead) = side_channel_pairs(capture, &labeled, &by_addr);
        let control = control_places(capture, &labeled, &by_epoch, &by_addr);
        let mut scorer = Scorer {
            labeled,
            by_epoch,
            pairs,
            lead,
            control,
            classified: HashMap::new(),
        };
        if let Some(c) = classifier {
            let mut classified = HashMap::new();
            for (e, flows) in &scorer.by_epoch {
                for &b in scorer.by_epoch.get(&(e + 1)).into_iter().flatten() {
                    for &a in flows {
                        let x = scorer.example(a, b, false).features;
                        classified.insert((a, b), c.classify(&x));
                    }
                }
            }
            scorer.classified = classified;
        }
        scorer
    }

    /// Every true link: (flow of epoch e, its successor, the flows of epoch e+1).
    fn true_links(&self) -> impl Iterator<Item = (usize, usize, &[usize])> + '_ {
        self.labeled
            .iter()
            .enumerate()
            .filter_map(|(a, (_, _, la))| {
                let candidates = self.by_epoch.get(&(la.epoch + 1))?;
                let truth_b = candidates
                    .iter()
                    .find(|&&b| self.labeled[b].2.stream == la.stream)?;
                Some((a, *truth_b, &candidates[..]))
            })
    }

    /// The pair (a, b) as the classifier sees it.
    fn example(&self, a: usize, b: usize, same: bool) -> Example {
        Example {
            features: classifier::FEATURES
                .iter()
                .map(|&m| self.score(m, a, b))
                .collect(),
            same,
        }
    }

    /// How strongly method `m` ties flow `a` to flow `b` (None: nothing to read).
    fn score(&self, m: Method, a: usize, b: usize) -> Option<f64> {
        if matches!(m, Method::ControlOrder | Method::ControlOffset) {
            let (ca, cb) = (self.control.get(&a)?, self.control.get(&b)?);
            let d: Vec<f64> = ca
                .iter()
                .filter_map(|(key, pa)| {
                    let pb = cb.get(key)?;
                    Some(match m {
                        Method::ControlOrder => (pa.0 - pb.0).abs(),
                        _ => (pa.1 - pb.1).abs(),
                    })
                })
                .collect();
            return (!d.is_empty()).then(|| -d.iter().sum::<f64>());
        }
        if m == Method::Classifier {
            return self.classified.get(&(a, b)).copied();
        }
        if let Some(n) = self.pairs.get(&(m, a, b)) {
            return Some(f64::from(*n));
        }
        let (fa, fb) = (self.labeled[a].1, self.labeled[b].1);
        // Pair the directions by sender when both flows have one (an on-link observer
        // tells the two gateways apart); else try every pairing.
        // Both directions must agree, so their scores add up.
        let same: Vec<f64> = fa
            .directions
            .iter()
            .filter_map(|(s, da)| score_direction(m, da, fb.directions.get(s)?))
            .collect();
        if !same.is_empty() {
            return Some(same.iter().sum());
        }
        fa.directions
            .values()
            .flat_map(|da| fb.directions.values().map(move |db| (da, db)))
            .filter_map(|(da, db)| score_direction(m, da, db))
            .reduce(f64::max)
    }

    /// Method `m` against the ground truth, flow by flow and jointly.
    fn evaluate(&self, m: Method) -> MethodResult {
        let (mut links, mut credit, mut chance, mut decisive, mut right) = (0, 0.0, 0.0, 0, 0);
        for (a, truth_b, candidates) in self.true_links() {
            links += 1;
            chance += 1.0 / candidates.len() as f64;
            let scores: Vec<(usize, f64)> = candidates
                .iter()
                .map(|&b| (b, self.score(m, a, b).unwrap_or(f64::NEG_INFINITY)))
                .collect();
            let best = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
            let tied: Vec<usize> = scores.iter().filter(|s| s.1 == best).map(|s| s.0).collect();
            if tied.contains(&truth_b) {
                credit += 1.0 / tied.len() as f64;
            }
            if tied.len() == 1 {
                decisive += 1;
                right += usize::from(tied[0] == truth_b);
            }
        }
        let matched_credit: f64 = self
            .by_epoch
            .iter()
            .map(|(e, flows)| {
                let Some(next) = self.by_epoch.get(&(e + 1)) else {
                    return 0.0;
                };
                let successors: Vec<(usize, usize)> = flows
                    .iter()
                    .filter_map(|&a| {
                        let stream = self.labeled[a].2.stream;
                        let b = next.iter().find(|&&b| self.labeled[b].2.stream == stream)?;
                        Some((a, *b))
                    })
                    .collect();
                matching_credit(&successors, next, |a, b| self.score(m, a, b).unwrap_or(0.0))
            })
            .sum();
        let frac = |x: f64| if links == 0 { 0.0 } else { x / links as f64 };
        MethodResult {
            method: m.name(),
            links,
            recovered: frac(credit),
            matched: frac(matched_credit),
            chance: frac(chance),
            decisive,
            precision: (decisive > 0).then(|| right as f64 / decisive as f64),
        }
    }
}

/// Side channels: how many messages of each kind name addresses of both flows of a pair, and
/// how long before its first tunnel packet each flow's address was first named.
#[allow(clippy::type_complexity)]
fn side_channel_pairs(
    capture: &Capture,
    labeled: &[(&FlowKey, &Flow, Label)],
    by_addr: &HashMap<Named, Vec<usize>>,
) -> (HashMap<(Method, usize, usize), u32>, HashMap<usize, f64>) {
    let mut pairs: HashMap<(Method, usize, usize), u32> = HashMap::new();
    let mut lead: HashMap<usize, f64> = HashMap::new();
    for (&method, messages) in &capture.messages {
        for (ts, names) in messages {
            let touched: BTreeSet<usize> = names
                .iter()
                .filter_map(|n| by_addr.get(n))
                .flatten()
                .copied()
                .collect();
            for &f in &touched {
                let ahead = labeled[f].1.first_seen - ts;
                if ahead > 0.0 {
                    let l = lead.entry(f).or_default();
                    *l = l.max(ahead);
                }
            }
            for &a in &touched {
                for &b in &touched {
                    if a != b {
                        *pairs.entry((method, a, b)).or_default() += 1;
                    }
                }
            }
        }
    }
    (pairs, lead)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn ether(mac: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x86, 0xdd]);
        f
    }

    fn ip6(mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, next: u8, upper: &[u8]) -> Frame {
        let mut f = ether(mac);
        let len = upper.len() as u16;
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[next, 64]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(upper);
        Frame {
            ts: 0.0,
            wire_len: f.len() as u32,
            bytes: f,
        }
    }

    fn udp(mac: [u8; 6], src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8]) -> Frame {
        let mut u = src.port().to_be_bytes().to_vec();
        u.extend_from_slice(&dst.port().to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        ip6(mac, *src.ip(), *dst.ip(), 17, &u)
    }

    fn ep(s: &str, port: u16) -> SocketAddrV6 {
        SocketAddrV6::new(s.parse().expect("literal"), port, 0, 0)
    }

    /// Two streams over three epochs; `counter(stream, epoch, i)` is the i-th payload's first
    /// 8 bytes. Returns the frames and the truth.
    fn two_streams(counter: impl Fn(usize, u64, u64) -> u64) -> (Vec<Frame>, Truth) {
        let mut frames = Vec::new();
        let mut truth = Truth::default();
        for e in 0..3u64 {
            for s in 0..2usize {
                let tag = (e * 2 + s as u64) as u16 + 1;
                let a = ep(&format!("2001:db8:ff::{tag:x}:a"), 1000 + tag);
                let b = ep(&format!("2001:db8:ff::{tag:x}:b"), 2000 + tag);
                truth.add(
                    a,
                    b,
                    Label {
                        stream: s,
                        epoch: e,
                    },
                );
                for i in 0..4 {
                    // Each gateway's own counter: B's is far from A's.
                    for (mac, from, to, base) in [(MAC_A, a, b, 0), (MAC_B, b, a, 1 << 40)] {
                        let mut p = counter(s, e, i + base).to_be_bytes().to_vec();
                        p.extend_from_slice(&[0u8; 40]);
                        let mut frame = udp(mac, from, to, &p);
                        frame.ts = e as f64 + i as f64 * 0.01;
                        frames.push(frame);
                    }
                }
            }
        }
        (frames, truth)
    }

    #[test]
    fn a_running_counter_links_every_epoch_and_a_random_one_nothing() {
        // Stream s's counter starts at s * 1e9 and runs on across epochs.
        let (frames, truth) = two_streams(|s, e, i| s as u64 * 1_000_000_000 + e * 4 + i);
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "test");
        let c = r.result(Method::Counter).expect("counter row");
        assert_eq!(c.links, 4);
        assert_eq!(c.recovered, 1.0);
        assert_eq!(c.chance, 0.5);
        assert_eq!(c.precision, Some(1.0));
        assert_eq!(c.matched, 1.0);
        // Every flow has the same flow label, hop limit, sizes: ties, exactly chance.
        for m in [Method::FlowLabel, Method::HopLimit, Method::PacketSizes] {
            let row = r.result(m).expect("row");
            assert_eq!((row.recovered, row.matched), (0.5, 0.5), "{m:?}");
        }
        // Both streams switch at the same instant: handover times tie too.
        let h = r.result(Method::Handover).expect("row");
        assert_eq!((h.recovered, h.matched), (0.5, 0.5), "{}", r.table());
        // The clear counter's words (stream 1's high word is 0x3b9a, stream 0's zero) link
        // too; nothing else does.
        let linking: Vec<&str> = r.linking(0.25, 0.35).iter().map(|m| m.method).collect();
        assert_eq!(
            linking,
            [Method::Counter.name(), Method::PayloadWords.name()],
            "{}",
            r.table()
        );

        // One daemon starts both streams' counters at the same clock reading: they run one
        // apart, and only the rule that a counter never goes back tells them apart.
        let (frames, truth) = two_streams(|s, e, i| 1000 + 1 - s as u64 + e * 4 + i);
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "test");
        let c = r.result(Method::Counter).expect("counter row");
        assert_eq!(
            (c.recovered, c.precision),
            (1.0, Some(1.0)),
            "{}",
            r.table()
        );

        // Counters masked: a keyed permutation of the true value links by luck only.
        let (frames, truth) = two_streams(|s, e, i| {
            (s as u64 * 1_000_000_000 + e * 4 + i)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(29)
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "test");
        let c = r.result(Method::Counter).expect("counter row");
        assert!(c.recovered < 1.0, "{}", r.table());
    }

    /// `n` streams over `epochs` epochs of 1 s, each flow with 4 data packets of unique bytes
    /// from each gateway; `control(stream, epoch)` gives the time (from the epoch's start) and
    /// payload of a control message Gateway A sends on the flow, if any.
    fn streams(
        n: usize,
        epochs: u64,
        control: impl Fn(usize, u64) -> Option<(f64, [u8; 32])>,
    ) -> (Vec<Frame>, Truth) {
        let mut frames = Vec::new();
        let mut truth = Truth::default();
        for e in 0..epochs {
            for s in 0..n {
                let tag = (e * n as u64 + s as u64) as u16 + 1;
                let a = ep(&format!("2001:db8:ff::{tag:x}:a"), 1000 + tag);
                let b = ep(&format!("2001:db8:ff::{tag:x}:b"), 2000 + tag);
                truth.add(
                    a,
                    b,
                    Label {
                        stream: s,
                        epoch: e,
                    },
                );
                for i in 0..4u64 {
                    for (mac, from, to) in [(MAC_A, a, b), (MAC_B, b, a)] {
                        let unique = (u64::from(tag) << 32 | i << 1 | u64::from(mac == MAC_B))
                            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        let mut p = unique.to_be_bytes().to_vec();
                        p.extend_from_slice(&[0u8; 56]);
                        let mut frame = udp(mac, from, to, &p);
                        frame.ts = e as f64 + 0.05 + i as f64 * 0.01;
                        frames.push(frame);
                    }
                }
                if let Some((at, payload)) = control(s, e) {
                    let mut frame = udp(MAC_A, a, b, &payload);
                    frame.ts = e as f64 + at;
                    frames.push(frame);
                }
            }
        }
        (frames, truth)
    }

    /// A payload of 32 distinct bytes for message `i`.
    fn fresh(i: u64) -> [u8; 32] {
        let mut p = [0u8; 32];
        for (k, c) in p.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(
                &(i * 4 + k as u64 + 1)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .to_be_bytes(),
            );
        }
        p
    }

    #[test]
    fn control_messages_in_a_fixed_order_link_and_shuffled_ones_do_not() {
        const N: usize = 5;
        const EPOCHS: u64 = 40;
        // One burst per epoch, in configuration order, 10 ms after the boundary.
        let (frames, truth) = streams(N, EPOCHS, |s, e| {
            Some((0.01 + s as f64 * 0.0002, fresh(e * 100 + s as u64)))
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "burst");
        let order = r.result(Method::ControlOrder).expect("row");
        assert_eq!(order.links, N * (EPOCHS as usize - 1));
        assert_eq!(order.recovered, 1.0, "{}", r.table());
        assert!((order.chance - 1.0 / N as f64).abs() < 1e-9);
        let offset = r.result(Method::ControlOffset).expect("row");
        assert_eq!(offset.recovered, 1.0, "{}", r.table());
        // Fresh bytes every time: nothing repeats.
        assert_eq!(r.repeated_headers, 0);
        assert_eq!(
            r.result(Method::Repeats).expect("row").recovered,
            order.chance
        );

        // Shuffled and spread over 600 ms, independently each epoch (a fixed pseudorandom
        // sequence): order and offset fall to about chance.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut times = std::collections::HashMap::new();
        for e in 0..EPOCHS {
            for s in 0..N {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                times.insert((s, e), 0.1 + (x % 600_000) as f64 / 1e6);
            }
        }
        let (frames, truth) = streams(N, EPOCHS, |s, e| {
            Some((times[&(s, e)], fresh(e * 100 + s as u64)))
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "spread");
        for m in [Method::ControlOrder, Method::ControlOffset] {
            let row = r.result(m).expect("row");
            assert!(
                row.recovered < row.chance + 0.15,
                "{m:?} links a shuffled schedule: {}",
                r.table()
            );
        }

        // The same announcement re-sent byte for byte in the next epoch's flow: linked.
        let (frames, truth) = streams(N, EPOCHS, |s, e| Some((0.1, fresh(e / 2 * 100 + s as u64))));
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "repeats");
        assert_eq!(r.repeated_headers, N * EPOCHS as usize / 2);
        let rep = r.result(Method::Repeats).expect("row");
        // The links from an even epoch share a payload (decisive and right); the rest tie.
        let (shared, total) = (N * EPOCHS as usize / 2, N * (EPOCHS as usize - 1));
        assert_eq!((rep.decisive, rep.precision), (shared, Some(1.0)));
        let want = (shared as f64 + (total - shared) as f64 / N as f64) / total as f64;
        assert!((rep.recovered - want).abs() < 1e-9, "{}", r.table());
    }

    #[test]
    fn a_solicitation_naming_two_epochs_links_them() {
        let (mut frames, truth) = two_streams(|_, _, i| i);
        // Stream 1's epoch-1 A address solicits stream 1's epoch-0 B address: 001 §4.2's oracle.
        let (a1, b0): (Ipv6Addr, Ipv6Addr) = (
            "2001:db8:ff::4:a".parse().expect("a"),
            "2001:db8:ff::2:b".parse().expect("b"),
        );
        let mut ns = vec![135, 0, 0, 0, 0, 0, 0, 0];
        ns.extend_from_slice(&b0.octets());
        let mut solicitation = ip6(MAC_A, a1, b0, 58, &ns);
        solicitation.ts = 0.5;
        frames.push(solicitation);
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "test");
        // Sent half a second before epoch 1's first packet: the address was announced early.
        assert_eq!(r.flows_named_early, 1);
        assert!((r.longest_lead_secs - 0.5).abs() < 1e-9);
        let nd = r.result(Method::NeighborDiscovery).expect("row");
        // One of four links is named outright; the other three are ties.
        assert_eq!(nd.decisive, 1);
        assert_eq!(nd.precision, Some(1.0));
        assert!((nd.recovered - (1.0 + 3.0 * 0.5) / 4.0).abs() < 1e-9);
        assert_eq!(
            r.side_channel_messages
                .get(Method::NeighborDiscovery.name()),
            Some(&1)
        );
    }

    #[test]
    fn mld_reports_name_groups_and_errors_name_quoted_addresses() {
        let (mut frames, truth) = two_streams(|_, _, i| i);
        let a0: Ipv6Addr = "2001:db8:ff::1:a".parse().expect("a");
        let a1: Ipv6Addr = "2001:db8:ff::3:a".parse().expect("a");
        let group = |a: Ipv6Addr| {
            let o = a.octets();
            Ipv6Addr::new(
                0xff02,
                0,
                0,
                0,
                0,
                1,
                0xff00 | u16::from(o[13]),
                u16::from_be_bytes([o[14], o[15]]),
            )
        };
        // MLDv2 report after a hop-by-hop header: two records, no sources.
        let mut hbh = vec![58, 0, 5, 2, 0, 0, 1, 0];
        let mut mld = vec![143, 0, 0, 0, 0, 0, 0, 2];
        for a in [a1, a0] {
            mld.extend_from_slice(&[4, 0, 0, 0]);
            mld.extend_from_slice(&group(a).octets());
        }
        hbh.extend_from_slice(&mld);
        let ll: Ipv6Addr = "fe80::1".parse().expect("ll");
        frames.push(ip6(MAC_A, ll, "ff02::16".parse().expect("mc"), 0, &hbh));
        // A Destination Unreachable from epoch 1's address quoting a packet of epoch 0.
        let mut du = vec![1, 3, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0, 0, 8, 17, 64];
        du.extend_from_slice(&a0.octets());
        du.extend_from_slice(&"2001:db8:ff::1:b".parse::<Ipv6Addr>().expect("b").octets());
        frames.push(ip6(
            MAC_A,
            a1,
            "2001:db8:ff::3:b".parse().expect("b"),
            58,
            &du,
        ));
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "test");
        for m in [Method::MldReports, Method::IcmpErrors] {
            let row = r.result(m).expect("row");
            assert_eq!(
                (row.decisive, row.precision),
                (1, Some(1.0)),
                "{m:?}: {}",
                r.table()
            );
        }
    }

    /// `n` streams over `epochs` epochs of 1 s, Gateway A sending each flow's packets at
    /// `packets(stream, epoch)`: (seconds into the epoch, payload bytes) each.
    fn shaped(
        n: usize,
        epochs: u64,
        mut packets: impl FnMut(usize, u64) -> Vec<(f64, usize)>,
    ) -> (Vec<Frame>, Truth) {
        let mut frames = Vec::new();
        let mut truth = Truth::default();
        for e in 0..epochs {
            for s in 0..n {
                let tag = (e * n as u64 + s as u64) as u16 + 1;
                let a = ep(&format!("2001:db8:ff::{tag:x}:a"), 1000 + tag);
                let b = ep(&format!("2001:db8:ff::{tag:x}:b"), 2000 + tag);
                truth.add(
                    a,
                    b,
                    Label {
                        stream: s,
                        epoch: e,
                    },
                );
                for (i, (at, len)) in packets(s, e).into_iter().enumerate() {
                    // Unique bytes: no counter, word or repeat to link by.
                    let unique =
                        (u64::from(tag) << 32 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut p = unique.to_be_bytes().to_vec();
                    p.resize(len.max(8), 0);
                    let mut frame = udp(MAC_A, a, b, &p);
                    frame.ts = e as f64 + at;
                    frames.push(frame);
                }
            }
        }
        (frames, truth)
    }

    fn traffic_rows(r: &LinkReport) -> Vec<&MethodResult> {
        Method::TRAFFIC
            .iter()
            .filter_map(|&m| r.result(m))
            .collect()
    }

    #[test]
    fn a_periodic_flow_that_keeps_its_phase_is_linked_by_it() {
        // Four identical 100/s trains, each at its own phase (0, 2.3, 4.6, 6.9 ms): only the
        // phase tells them apart, and it runs on across the switch.
        let (frames, truth) = shaped(4, 20, |s, _| {
            (0..100)
                .map(|k| (0.001 + s as f64 * 0.0023 + k as f64 * 0.01, 100))
                .collect()
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "phase");
        let phase = r.result(Method::TimingPhase).expect("row");
        assert_eq!(
            (phase.recovered, phase.matched),
            (1.0, 1.0),
            "{}",
            r.table()
        );
        // Same volume and sizes: these tie at chance.
        for m in [Method::Bytes, Method::Packets, Method::SizeDistribution] {
            let row = r.result(m).expect("row");
            assert!(
                (row.recovered - row.chance).abs() < 1e-9,
                "{m:?}: {}",
                r.table()
            );
        }
    }

    #[test]
    fn identical_poisson_flows_are_not_linked_and_different_volumes_are() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        // Four conversations sending the same Poisson process (mean gap 10 ms, 200-byte
        // packets): nothing but chance to link them by.
        let (frames, truth) = shaped(4, 40, |_, _| {
            let mut t = rng.random_range(0.0..0.01);
            let mut v = Vec::new();
            while t < 1.0 {
                v.push((t, 200));
                t -= 0.01 * rng.random_range(f64::EPSILON..1.0f64).ln();
            }
            v
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "poisson");
        let rows = traffic_rows(&r);
        assert_eq!(rows.len(), 7, "no classifier row without a classifier");
        for row in rows {
            // 156 links at chance 1/4: three standard deviations are 0.10.
            assert!(
                row.recovered < row.chance + 0.12,
                "{}: {}",
                row.method,
                r.table()
            );
            assert!(row.links == 156 && row.chance == 0.25);
        }
        // Volumes 10, 20, 40, 80 packets per epoch of 100 to 400 bytes: linked by volume.
        let (frames, truth) = shaped(4, 10, |s, _| {
            let n = 10 << s;
            (0..n)
                .map(|k| (k as f64 / n as f64, 100 + 100 * s))
                .collect()
        });
        let r = link(&Capture::new(&frames, Vantage::OnLink), &truth, "volume");
        for m in [Method::Bytes, Method::Packets, Method::SizeDistribution] {
            let row = r.result(m).expect("row");
            assert_eq!(
                (row.recovered, row.matched),
                (1.0, 1.0),
                "{m:?}: {}",
                r.table()
            );
        }
    }

    #[test]
    fn a_classifier_trained_on_one_capture_links_a_fresh_one() {
        use rand::{Rng, SeedableRng};
        // Eight conversations of different rates (5/s to 640/s) with jittered timers: a
        // fresh capture of the same kind, with other addresses and other jitter.
        let capture = |seed: u64| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            shaped(8, 12, |s, _| {
                let gap = 0.2 / f64::from(1u32 << s);
                let mut t = rng.random_range(0.0..gap);
                let mut v = Vec::new();
                while t < 1.0 {
                    v.push((t, 80 + 60 * (s % 3)));
                    t += gap * rng.random_range(0.5..1.5);
                }
                v
            })
        };
        let (frames, truth) = capture(1);
        let examples = training_examples(&Capture::new(&frames, Vantage::OnLink), &truth, 1);
        let classifier = Classifier::train(&examples).expect("trains");
        let (frames, truth) = capture(2);
        let r = link_with(
            &Capture::new(&frames, Vantage::OnLink),
            &truth,
            "fresh",
            Some(&classifier),
        );
        let row = r.result(Method::Classifier).expect("a classifier row");
        assert_eq!(row.links, 8 * 11);
        assert!(row.recovered > 0.9 && row.matched > 0.9, "{}", r.table());
    }

    #[test]
    fn past_the_router_sees_one_prefix_only() {
        let (frames, truth) = two_streams(|_, _, i| i);
        let none = Capture::new(
            &frames,
            Vantage::PastRouter {
                from_prefix: "2001:db8:a::".parse().expect("p"),
            },
        );
        assert_eq!(none.udp_frames, 0);
        let all = Capture::new(
            &frames,
            Vantage::PastRouter {
                from_prefix: "2001:db8:ff::".parse().expect("p"),
            },
        );
        assert_eq!(all.udp_frames, frames.len());
        assert_eq!(link(&all, &truth, "t").labeled_flows, 6);
    }

    #[test]
    fn pcap_round_trips_and_truncation_is_an_error() {
        let mut file = Vec::new();
        for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 256, 1] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        for v in [7u32, 500_000, 3, 1500] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&[1, 2, 3]);
        let frames = parse_pcap(&file, "x.pcap").expect("parses");
        assert_eq!(frames.len(), 1);
        assert_eq!((frames[0].ts, frames[0].wire_len), (7.5, 1500));
        assert_eq!(frames[0].bytes, [1, 2, 3]);
        assert!(matches!(
            parse_pcap(&file[..file.len() - 1], "x.pcap"),
            Err(LinkerError::Truncated { record: 0, .. })
        ));
        assert!(matches!(
            parse_pcap(&[0; 24], "x"),
            Err(LinkerError::NotPcap { .. })
        ));
        // Garbage frames are skipped, never a panic.
        let garbage = [Frame {
            ts: 0.0,
            wire_len: 9,
            bytes: vec![0, 1, 2, 0x86, 0xdd, 0x60],
        }];
        assert_eq!(Capture::new(&garbage, Vantage::OnLink).udp_frames, 0);
    }
}
