//! What the packet threads do to the TCP segments they forward (seed 004's HOST_ID): each peer's
//! identity option policy per direction (`host_id_out` on a sealing worker before sealing,
//! `host_id_in` on the receiving worker after opening), injection (004 §3.2.1 SYN mode, §3.2.2 ACK
//! mode) and MSS clamping to the tunnel MTU, with counters per event and per rule.
//!
//! Both threads see single segments with complete checksums: a sealing worker after the TUN read
//! split a GSO super-packet (and completed a `NEEDS_CSUM` one), the receiving worker before GRO
//! coalescing. So a super-packet is scrubbed segment by segment, and every segment of one flow
//! gets the same header, which GRO then coalesces as before.
//!
//! With `[tcp] normalize` (off by default), every packet from the protected side also gets the
//! normalised hop limit and flow label (a few byte writes and a hash of its header), and SYNs
//! lose their timestamps and get the canonical layout and window (docs/ARCHITECTURE.md, "SYN
//! fingerprint normalisation").
//!
//! Cost: a segment that is not TCP behind the fixed IPv6 header, or carries no option and is
//! not a SYN, is decided from three header bytes; one with options that are all kept standard
//! ones (timestamps on every segment of a Linux flow) takes one byte walk of its option block.
//! Only SYNs and segments with identity, unknown or malformed options go further, and only they
//! touch the atomics here. Extension headers are not walked: a TCP segment behind one passes
//! unexamined (documented in docs/CONFIG.md).

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use mt6d_proto::scrub::{
    build_option, clamp_mss, evaluate, inject, needs_policy, normalize_ip, normalize_syn, strip,
    ChecksumField, ClampOutcome, HostIdForm, HostIdKinds, HostIdRule, InjectForm, InjectOutcome,
    NormalizeOutcome, RuleAction, StripOutcome,
};
use mt6d_proto::wire::{tcp_flags, IPV6_DST_ADDR, IPV6_SRC_ADDR};

use crate::config::{
    HostIdPolicies, HostIdPolicy, InjectMode, Normalize, TcpConfig, NORMAL_WINDOW_SEGMENTS,
};
use crate::status::{RuleStatus, TcpPolicyStatus};

/// Which way a segment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Protected side -> tunnel (sealing worker, `host_id_out`).
    Out = 0,
    /// Tunnel -> protected side (receiving worker, `host_id_in`).
    In = 1,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Out => "out",
            Direction::In => "in",
        }
    }
}

/// Events counted per peer and direction. The labels are stable (status, metrics).
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
enum Event {
    /// Segments that carried an identity option (or a block to rewrite) and met the policy.
    Inspected,
    /// Segments whose identity options were removed.
    Stripped,
    /// Identity options removed.
    OptionsRemoved,
    /// Segments forwarded with their identity options by an `accept`.
    Accepted,
    /// Segments dropped by a rule or the default action.
    Dropped,
    /// Segments with an unreadable option block or a malformed identity option.
    Malformed,
    /// Of those, forwarded untouched (`malformed = "accept"`).
    MalformedAccepted,
    /// Log lines written.
    Logged,
    /// Log lines left out by the rate limit.
    LogSuppressed,
    /// Options injected.
    Injected,
    /// Injections that did not fit (40 option bytes, or the MTU).
    InjectNoRoom,
    /// SYNs whose MSS was lowered.
    MssClamped,
    /// SYNs normalised (`normalize`): out, SYNs and SYN-ACKs; in, SYNs.
    Normalized,
    /// Of those, SYNs whose timestamps option was removed.
    TimestampsRemoved,
}

const EVENTS: [(Event, &str); 14] = [
    (Event::Inspected, "inspected"),
    (Event::Stripped, "stripped"),
    (Event::OptionsRemoved, "options_removed"),
    (Event::Accepted, "accepted"),
    (Event::Dropped, "dropped"),
    (Event::Malformed, "malformed"),
    (Event::MalformedAccepted, "malformed_accepted"),
    (Event::Logged, "logged"),
    (Event::LogSuppressed, "log_suppressed"),
    (Event::Injected, "injected"),
    (Event::InjectNoRoom, "inject_no_room"),
    (Event::MssClamped, "mss_clamped"),
    (Event::Normalized, "normalized"),
    (Event::TimestampsRemoved, "timestamps_removed"),
];

/// One direction's policy with its counters.
#[derive(Debug)]
struct DirectionPolicy {
    policy: HostIdPolicy,
    events: [AtomicU64; EVENTS.len()],
    /// Matches per rule (a `log` rule counts every match, a deciding rule its decisions).
    hits: Box<[AtomicU64]>,
}

impl DirectionPolicy {
    fn new(policy: HostIdPolicy) -> Self {
        let hits = policy.rules.iter().map(|_| AtomicU64::new(0)).collect();
        DirectionPolicy {
            policy,
            events: Default::default(),
            hits,
        }
    }

    fn count(&self, e: Event, n: u64) {
        self.events[e as usize].fetch_add(n, Relaxed);
    }
}

/// ACK mode flows (004 §3.2.2): a SYN-ACK that returned HOST_ID_ENABLED marks its flow here (rx
/// thread); a sealing worker injects HOST_ID_BOUCADAIR into that flow's next ACK and clears the
/// mark. A small direct-mapped table of flow hashes: a collision loses one injection, never
/// puts an option in another flow's segment (the whole hash must match).
#[derive(Debug)]
struct AckModeFlows {
    slots: [AtomicU64; ACK_SLOTS],
    /// Marks set and not yet used: while 0 a sealing worker looks nothing up.
    pending: AtomicU64,
}

const ACK_SLOTS: usize = 64;

impl AckModeFlows {
    fn new() -> Self {
        AckModeFlows {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            pending: AtomicU64::new(0),
        }
    }

    /// Flow key of (host, host port, remote, remote port), never 0 (0 marks a free slot).
    fn key(host: &[u8], host_port: u16, remote: &[u8], remote_port: u16) -> u64 {
        // FNV-1a: the flows are the gateway's own hosts' connections, not attacker-chosen keys
        // of a lookup structure; the table holds at most 64 and drops collisions.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in host
            .iter()
            .chain(&host_port.to_be_bytes())
            .chain(remote)
            .chain(&remote_port.to_be_bytes())
        {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h | 1
    }

    fn mark(&self, key: u64) {
        if self.slots[(key >> 1) as usize % ACK_SLOTS].swap(key, Relaxed) != key {
            self.pending.fetch_add(1, Relaxed);
        }
    }

    fn take(&self, key: u64) -> bool {
        let slot = &self.slots[(key >> 1) as usize % ACK_SLOTS];
        let taken = slot.compare_exchange(key, 0, Relaxed, Relaxed).is_ok();
        if taken {
            self.pending.fetch_sub(1, Relaxed);
        }
        taken
    }
}

/// A peer's TCP policy: the gateway-wide `[tcp]` settings and the peer's two directions.
#[derive(Debug)]
pub struct PeerTcp {
    /// `[tcp] host_id`: apply the identity policies.
    host_id: bool,
    /// Nothing to do to any segment (`host_id`, `mss_clamp` and `normalize` all off).
    bypass: bool,
    kinds: HostIdKinds,
    strip_unknown: bool,
    mss_clamp: bool,
    normalize: Option<Normalize>,
    /// The key of normalised flow labels (one per process, so a reload keeps every flow's).
    label_key: [u64; 2],
    dirs: [DirectionPolicy; 2],
    ack_mode: AckModeFlows,
}

/// The flow label key of this process, drawn once.
fn label_key() -> [u64; 2] {
    static KEY: OnceLock<[u64; 2]> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut b = [0u8; 16];
        // Without the system's randomness the labels are still one per flow and hide the
        // host's own, only predictable from the addresses and ports.
        if let Err(e) = getrandom::fill(&mut b) {
            log::warn!("no randomness for the flow label key: {e}");
        }
        let (lo, hi) = b.split_at(8);
        let w = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
        [w(lo), w(hi)]
    })
}

/// What to do with a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward `buf[..len]`.
    Forward(usize),
    /// Drop it (counted here).
    Drop,
}

/// Per-thread log budget: 10 lines a second with a burst of 10; what is left out is counted and
/// said in the next line written.
#[derive(Debug)]
pub struct LogBudget {
    tokens: f64,
    last: Option<Instant>,
    suppressed: u64,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget {
            tokens: LOG_BURST,
            last: None,
            suppressed: 0,
        }
    }
}

const LOG_BURST: f64 = 10.0;
const LOG_PER_SEC: f64 = 10.0;

impl LogBudget {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        if let Some(last) = self.last {
            self.tokens =
                (self.tokens + now.duration_since(last).as_secs_f64() * LOG_PER_SEC).min(LOG_BURST);
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// What one call needs besides the packet.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The MSS SYNs are clamped to (`mss_for_mtu` of the tunnel MTU now).
    pub mss: u16,
    /// The largest packet the tunnel carries now (an injected option must fit).
    pub mtu: usize,
}

const IP: usize = 40;

impl PeerTcp {
    pub fn new(tcp: &TcpConfig, policies: &HostIdPolicies) -> PeerTcp {
        PeerTcp {
            host_id: tcp.host_id,
            bypass: !tcp.host_id && !tcp.mss_clamp && tcp.normalize.is_none(),
            kinds: tcp.scrub.host_id_kinds,
            strip_unknown: tcp.scrub.strip_unknown,
            mss_clamp: tcp.mss_clamp,
            normalize: tcp.normalize,
            label_key: if tcp.normalize.is_some() {
                label_key()
            } else {
                [0; 2]
            },
            dirs: [
                DirectionPolicy::new(policies[0].clone()),
                DirectionPolicy::new(policies[1].clone()),
            ],
            ack_mode: AckModeFlows::new(),
        }
    }

    /// Applies the policy of `dir` to the IPv6 packet `buf[..len]` (a complete checksum), in
    /// place. `buf` beyond `len` is room an injected option may grow into. `peer` names the peer
    /// in log lines.
    pub fn apply(
        &self,
        buf: &mut [u8],
        len: usize,
        dir: Direction,
        limits: Limits,
        peer: &str,
        log: &mut LogBudget,
    ) -> Verdict {
        if self.bypass {
            return Verdict::Forward(len);
        }
        if dir == Direction::Out {
            if let (Some(n), Some(packet)) = (self.normalize, buf.get_mut(..len)) {
                normalize_ip(packet, n.hop_limit, &self.label_key);
            }
        }
        // The fast path: three header bytes. Not TCP behind the fixed header, or too short for
        // a TCP header (the checked views below refuse it; the peer's stack will too).
        if len < IP + 20 || buf.len() < len || buf[6] != mt6d_proto::wire::NEXT_HEADER_TCP {
            return Verdict::Forward(len);
        }
        let flags = buf[IP + 13];
        let doff = usize::from(buf[IP + 12] >> 4) * 4;
        let syn = flags & tcp_flags::SYN != 0;
        let ack_mode_pending = dir == Direction::Out && self.ack_mode.pending.load(Relaxed) > 0;
        if doff <= 20 && !syn && !ack_mode_pending {
            return Verdict::Forward(len);
        }
        let d = &self.dirs[dir as usize];
        let scrub = mt6d_proto::scrub::ScrubPolicy {
            host_id_kinds: self.kinds,
            strip_unknown: self.strip_unknown,
        };
        let mut len = len;
        let block_end = (IP + doff).min(len);
        let block = buf.get(IP + 20..block_end).unwrap_or_default();
        if self.host_id && doff > 20 && needs_policy(block, &scrub) {
            // A SYN-ACK returning HOST_ID_ENABLED to our ACK mode injector: note the flow
            // before the option is removed.
            if dir == Direction::In && syn && flags & tcp_flags::ACK != 0 {
                self.note_ack_mode(buf, block);
            }
            let ev = evaluate(block, self.kinds, &d.policy.rules, d.policy.default);
            d.count(Event::Inspected, 1);
            if ev.malformed {
                d.count(Event::Malformed, 1);
                if d.policy.drop_malformed {
                    return Verdict::Drop;
                }
                d.count(Event::MalformedAccepted, 1);
                return Verdict::Forward(len);
            }
            for (i, h) in d.hits.iter().enumerate() {
                if ev.logged & (1 << i) != 0 || ev.rule == Some(i) {
                    h.fetch_add(1, Relaxed);
                }
            }
            if (d.policy.log && ev.found > 0) || ev.logged != 0 {
                self.log_line(buf, dir, peer, &ev, log, d);
            }
            match ev.action {
                Some(RuleAction::Drop) => {
                    d.count(Event::Dropped, 1);
                    return Verdict::Drop;
                }
                Some(RuleAction::Accept) => {
                    d.count(Event::Accepted, 1);
                    return self.finish(buf, len, dir, flags, limits, d, false);
                }
                _ => {}
            }
            match strip(&mut buf[..len], &scrub, ChecksumField::Complete) {
                Ok(StripOutcome::Stripped {
                    options, new_len, ..
                }) => {
                    d.count(Event::Stripped, 1);
                    d.count(Event::OptionsRemoved, u64::from(options));
                    len = new_len;
                }
                Ok(_) => {}
                Err(_) => {
                    // A malformed option the walk above did not flag (a kept kind with a bad
                    // length): the block cannot be re-laid, so it cannot be vouched for.
                    d.count(Event::Malformed, 1);
                    if d.policy.drop_malformed {
                        return Verdict::Drop;
                    }
                    d.count(Event::MalformedAccepted, 1);
                    return Verdict::Forward(len);
                }
            }
        }
        self.finish(buf, len, dir, flags, limits, d, true)
    }

    /// What every forwarded segment gets after the identity policy: MSS clamping, then (SYNs,
    /// `normalize`) normalisation, which counts the window in segments of the final MSS, then
    /// injection (out, unless an `accept` forwarded the segment's own options).
    #[allow(clippy::too_many_arguments)] // one call site per verdict, all in this file
    fn finish(
        &self,
        buf: &mut [u8],
        mut len: usize,
        dir: Direction,
        flags: u8,
        limits: Limits,
        d: &DirectionPolicy,
        may_inject: bool,
    ) -> Verdict {
        let syn = flags & tcp_flags::SYN != 0;
        self.clamp(buf, len, syn, limits, d);
        if syn && self.normalize.is_some() {
            match self.normalize_syn(buf, len, dir, flags, d) {
                Some(l) => len = l,
                None => return Verdict::Drop,
            }
        }
        if dir == Direction::Out && may_inject {
            len = self.inject(buf, len, syn, flags, limits, d);
        }
        Verdict::Forward(len)
    }

    /// Out: SYNs and SYN-ACKs of the protected hosts lose their timestamps and get the
    /// canonical layout and window. In: SYNs to them lose their timestamps, so that a protected
    /// server never answers with its own (its SYN-ACK then has none to remove). `None`: a
    /// block that cannot be re-laid, dropped as malformed unless `malformed = "accept"`.
    fn normalize_syn(
        &self,
        buf: &mut [u8],
        len: usize,
        dir: Direction,
        flags: u8,
        d: &DirectionPolicy,
    ) -> Option<usize> {
        let segments = match dir {
            Direction::Out => NORMAL_WINDOW_SEGMENTS,
            Direction::In if flags & tcp_flags::ACK == 0 => u16::MAX,
            Direction::In => return Some(len),
        };
        let scrub = mt6d_proto::scrub::ScrubPolicy {
            host_id_kinds: self.kinds,
            strip_unknown: self.strip_unknown,
        };
        match normalize_syn(&mut buf[..len], &scrub, segments, ChecksumField::Complete) {
            Ok(NormalizeOutcome::Normalized {
                timestamps,
                new_len,
                ..
            }) => {
                d.count(Event::Normalized, 1);
                if timestamps {
                    d.count(Event::TimestampsRemoved, 1);
                }
                Some(new_len)
            }
            Ok(_) => Some(len),
            Err(_) => {
                d.count(Event::Malformed, 1);
                if d.policy.drop_malformed {
                    return None;
                }
                d.count(Event::MalformedAccepted, 1);
                Some(len)
            }
        }
    }

    fn clamp(&self, buf: &mut [u8], len: usize, syn: bool, limits: Limits, d: &DirectionPolicy) {
        if syn && self.mss_clamp {
            if let Ok(ClampOutcome::Clamped { .. }) = clamp_mss(
                &mut buf[..len],
                limits.mss,
                self.kinds,
                ChecksumField::Complete,
            ) {
                d.count(Event::MssClamped, 1);
            }
        }
    }

    /// SYN mode: the configured option into a SYN (not a SYN-ACK: the gateway speaks for the
    /// hosts behind it as clients). ACK mode: HOST_ID_ENABLED into the SYN, HOST_ID_BOUCADAIR
    /// into the first ACK of a flow whose SYN-ACK returned HOST_ID_ENABLED.
    fn inject(
        &self,
        buf: &mut [u8],
        len: usize,
        syn: bool,
        flags: u8,
        limits: Limits,
        d: &DirectionPolicy,
    ) -> usize {
        let Some(inj) = d.policy.inject else {
            return len;
        };
        let is_syn = syn && flags & tcp_flags::ACK == 0;
        let form = match (inj.mode, is_syn) {
            (InjectMode::Syn, true) => inj.form,
            (InjectMode::Ack, true) => InjectForm::Enabled,
            (InjectMode::Ack, false) if !syn && self.ack_mode.pending.load(Relaxed) > 0 => {
                let (src, dst, sport, dport) = addresses(buf);
                if !self.ack_mode.take(AckModeFlows::key(
                    &src.octets(),
                    sport,
                    &dst.octets(),
                    dport,
                )) {
                    return len;
                }
                inj.form
            }
            _ => return len,
        };
        let (src, _, sport, _) = addresses(buf);
        let mut opt = [0u8; 10];
        // The configuration checked that the form's kind is set.
        let Some(n) = build_option(form, inj.data, self.kinds, src, sport, &mut opt) else {
            return len;
        };
        let scrub = mt6d_proto::scrub::ScrubPolicy {
            host_id_kinds: self.kinds,
            strip_unknown: self.strip_unknown,
        };
        match inject(
            buf,
            len,
            limits.mtu,
            &opt[..n],
            &scrub,
            ChecksumField::Complete,
        ) {
            Ok(InjectOutcome::Injected { new_len, .. }) => {
                d.count(Event::Injected, 1);
                new_len
            }
            Ok(InjectOutcome::NoRoom) => {
                d.count(Event::InjectNoRoom, 1);
                len
            }
            _ => len,
        }
    }

    fn note_ack_mode(&self, buf: &[u8], block: &[u8]) {
        let Some(inj) = self.dirs[Direction::Out as usize].policy.inject else {
            return;
        };
        if inj.mode != InjectMode::Ack {
            return;
        }
        let enabled = mt6d_proto::scrub::TcpOptions::new(block, self.kinds)
            .any(|o| matches!(o, Ok(o) if o.option == mt6d_proto::scrub::TcpOption::HostIdEnabled));
        if enabled {
            // The SYN-ACK goes server -> host: the host's side is its destination.
            let (src, dst, sport, dport) = addresses(buf);
            self.ack_mode.mark(AckModeFlows::key(
                &dst.octets(),
                dport,
                &src.octets(),
                sport,
            ));
        }
    }

    #[cold]
    fn log_line(
        &self,
        buf: &[u8],
        dir: Direction,
        peer: &str,
        ev: &mt6d_proto::scrub::Evaluation,
        log: &mut LogBudget,
        d: &DirectionPolicy,
    ) {
        if !log.take() {
            d.count(Event::LogSuppressed, 1);
            return;
        }
        d.count(Event::Logged, 1);
        let (src, dst, sport, dport) = addresses(buf);
        let options: Vec<String> = ev
            .options
            .iter()
            .flatten()
            .map(|(f, v)| format!("{}={v:#x}", f.label()))
            .collect();
        let action = match ev.action {
            Some(RuleAction::Accept) => "accept",
            Some(RuleAction::Drop) => "drop",
            Some(RuleAction::Strip) | Some(RuleAction::Log) | None => "strip",
        };
        let by = ev
            .rule
            .map_or("default".to_string(), |r| format!("rule {}", r + 1));
        let suppressed = std::mem::take(&mut log.suppressed);
        let more = if suppressed > 0 {
            format!(" ({suppressed} earlier lines left out)")
        } else {
            String::new()
        };
        log::info!(
            "peer {peer:?} {}: HOST_ID {} [{src}]:{sport} -> [{dst}]:{dport}: {action} ({by}){more}",
            dir.label(),
            options.join(" "),
        );
    }

    /// Counters for `mt6d status`, both directions.
    pub fn status(&self) -> Vec<TcpPolicyStatus> {
        [Direction::Out, Direction::In]
            .into_iter()
            .map(|dir| {
                let d = &self.dirs[dir as usize];
                TcpPolicyStatus {
                    direction: dir.label().into(),
                    events: EVENTS
                        .iter()
                        .map(|&(e, l)| (l.to_string(), d.events[e as usize].load(Relaxed)))
                        .collect(),
                    rules: d
                        .policy
                        .rules
                        .iter()
                        .zip(d.hits.iter())
                        .map(|(r, h)| RuleStatus {
                            rule: describe(r),
                            hits: h.load(Relaxed),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// A rule as a person wrote it: `wing 0x1000-0x1fff drop`.
fn describe(r: &HostIdRule) -> String {
    let form = r.form.map_or("any", HostIdForm::label);
    let (lo, hi) = (*r.values.start(), *r.values.end());
    let values = if (lo, hi) == (0, u64::MAX) {
        String::new()
    } else if lo == hi {
        format!(" {lo:#x}")
    } else {
        format!(" {lo:#x}-{hi:#x}")
    };
    let action = match r.action {
        RuleAction::Accept => "accept",
        RuleAction::Drop => "drop",
        RuleAction::Strip => "strip",
        RuleAction::Log => "log",
    };
    format!("{form}{values} {action}")
}

/// Source, destination, source port, destination port of an IPv6+TCP packet whose first 44
/// bytes the caller checked.
fn addresses(buf: &[u8]) -> (Ipv6Addr, Ipv6Addr, u16, u16) {
    let a = |r: std::ops::Range<usize>| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&buf[r]);
        Ipv6Addr::from(o)
    };
    (
        a(IPV6_SRC_ADDR),
        a(IPV6_DST_ADDR),
        u16::from_be_bytes([buf[IP], buf[IP + 1]]),
        u16::from_be_bytes([buf[IP + 2], buf[IP + 3]]),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use mt6d_proto::scrub::ScrubPolicy;
    use mt6d_proto::wire::upper_layer_checksum;

    const A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xa);
    const B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xb);

    /// A SYN A -> B: MSS 1440, NOP, NOP, HOST_ID_WING (kind 200) 0x3039, with its checksum.
    fn syn_with_wing() -> Vec<u8> {
        let mut p = vec![0u8; 40 + 32];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&32u16.to_be_bytes());
        p[6] = 6;
        p[7] = 64;
        p[8..24].copy_from_slice(&A.octets());
        p[24..40].copy_from_slice(&B.octets());
        p[40..52].copy_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0]);
        p[52] = 8 << 4;
        p[53] = tcp_flags::SYN;
        p[54..56].copy_from_slice(&[0xfa, 0xf0]);
        p[60..72].copy_from_slice(&[2, 4, 0x05, 0xa0, 1, 1, 200, 4, 0x30, 0x39, 0, 0]);
        let c = upper_layer_checksum(A, B, 6, &p[40..]);
        p[56..58].copy_from_slice(&c.to_be_bytes());
        p
    }

    fn run(host_id: bool, mss_clamp: bool) -> Vec<u8> {
        let tcp = TcpConfig {
            mss_clamp,
            host_id,
            scrub: ScrubPolicy {
                host_id_kinds: HostIdKinds {
                    wing: Some(200),
                    boucadair: None,
                    enabled: None,
                },
                strip_unknown: false,
            },
            normalize: None,
        };
        let t = PeerTcp::new(&tcp, &Default::default());
        let mut buf = syn_with_wing();
        buf.resize(buf.len() + 40, 0);
        let limits = Limits {
            mss: 1380,
            mtu: 1440,
        };
        let Verdict::Forward(n) = t.apply(
            &mut buf,
            72,
            Direction::Out,
            limits,
            "b",
            &mut LogBudget::default(),
        ) else {
            panic!("dropped");
        };
        buf.truncate(n);
        buf
    }

    #[test]
    fn host_id_off_forwards_identity_options_and_still_clamps_if_asked() {
        let syn = syn_with_wing();
        // Everything off: the segment is not looked at.
        assert_eq!(run(false, false), syn);
        // Identity policy off, clamping on: the WING stays, the MSS is lowered.
        let clamped = run(false, true);
        assert_eq!(clamped.len(), syn.len());
        assert_eq!(clamped[62..64], 1380u16.to_be_bytes());
        assert_eq!(clamped[64..72], syn[64..72]);
        assert_eq!(upper_layer_checksum(A, B, 6, &clamped[40..]), 0);
        // The default: the WING is stripped.
        let stripped = run(true, false);
        assert!(stripped.len() < syn.len());
        assert!(!stripped[60..].contains(&200));
    }
}
