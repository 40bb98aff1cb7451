//! Policy over the identity options of one segment: which HOST_ID form it carries with which
//! value, matched against an ordered rule list (004 §8.4-8.5: the server-side iptables `hostid`
//! match, `value[:value]`, with LOG, DROP and ACCEPT targets), and the bytes of an option a
//! gateway injects (004 §7.1: the AFTR's `hostid_wing`, `hostid_boucadair`, `hostid_enabled`).
//!
//! Pure: the daemon supplies the rules, counts what [`evaluate`] reports and writes the log.

use std::net::Ipv6Addr;
use std::ops::RangeInclusive;

use super::options::{BoucadairData, HostIdKinds, TcpOption, TcpOptions};

/// The identity option forms a rule can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostIdForm {
    /// 004 §3.1 HOST_ID_WING (2, 4 or 8 data bytes).
    Wing,
    /// 004 §3.2 HOST_ID_BOUCADAIR.
    Boucadair,
    /// 004 §3.2 HOST_ID_ENABLED (no data: its value is 0).
    Enabled,
    /// RFC 7974 HOST_ID (kind 253/254, ExID 0x0348).
    Rfc7974,
    /// TOA (kind 254, length 8).
    Toa,
}

impl HostIdForm {
    /// The name used in the configuration, the status and the log.
    pub fn label(self) -> &'static str {
        match self {
            HostIdForm::Wing => "wing",
            HostIdForm::Boucadair => "boucadair",
            HostIdForm::Enabled => "enabled",
            HostIdForm::Rfc7974 => "rfc7974",
            HostIdForm::Toa => "toa",
        }
    }
}

/// The form and the value a rule compares, of an identity option (`None` for any other).
///
/// Values are the option's data read as a big-endian integer, by what the data means: WING's 2, 4
/// or 8 bytes; BOUCADAIR by origin (004 §3.2: the port, the IPv4 address, port and address as
/// `port << 32 | addr`, or the 7 bytes of a prefix or of an origin above 3); RFC 7974's first 8
/// data bytes; TOA's `port << 32 | addr`; ENABLED 0. So `value = 0x1234` matches a WING carrying
/// 12 34 and a BOUCADAIR of origin 0 carrying port 0x1234, which is what 004 §8.4's examples
/// (the last 16 bits of a private IPv4 address, a port) compare.
pub fn identity_value(o: &TcpOption<'_>) -> Option<(HostIdForm, u64)> {
    let be = |d: &[u8]| d.iter().take(8).fold(0u64, |v, &b| v << 8 | u64::from(b));
    Some(match *o {
        TcpOption::HostIdWing(d) => (HostIdForm::Wing, be(d)),
        TcpOption::HostIdBoucadair(b) => (
            HostIdForm::Boucadair,
            match b.data {
                BoucadairData::InternalPort(p) => u64::from(p),
                BoucadairData::InternalIpv4(a) => u64::from(u32::from(a)),
                BoucadairData::PortAndIpv4(p, a) => u64::from(p) << 32 | u64::from(u32::from(a)),
                BoucadairData::Ipv6Prefix(d) | BoucadairData::Other { data: d, .. } => be(&d),
            },
        ),
        TcpOption::HostIdEnabled => (HostIdForm::Enabled, 0),
        TcpOption::HostIdExperimental { data, .. } => (HostIdForm::Rfc7974, be(data)),
        TcpOption::Toa { port, addr } => (
            HostIdForm::Toa,
            u64::from(port) << 32 | u64::from(u32::from(addr)),
        ),
        _ => return None,
    })
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleAction {
    /// Forward the segment as it is, identity options included (a trusted source).
    Accept,
    /// Drop the segment (004 §8.5).
    Drop,
    /// Remove every identity option (and forward).
    Strip,
    /// Log the match and go on to the next rule (004 §8.4's LOG target; not a decision).
    Log,
}

/// One rule: a form (or any) and a value range (or any), and an action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostIdRule {
    /// The form it matches; `None`: any identity option.
    pub form: Option<HostIdForm>,
    /// The values it matches (inclusive; `0..=u64::MAX` for any).
    pub values: RangeInclusive<u64>,
    /// What it does.
    pub action: RuleAction,
}

impl HostIdRule {
    fn matches(&self, form: HostIdForm, value: u64) -> bool {
        self.form.is_none_or(|f| f == form) && self.values.contains(&value)
    }
}

/// Most rules per direction: [`Evaluation::logged`] is a bit per rule.
pub const MAX_RULES: usize = 32;
/// Identity options [`Evaluation`] reports (a 40-byte block holds at most 20 ENABLEDs; more
/// than 4 are counted, and decide, but are not listed).
pub const REPORTED: usize = 4;

/// What [`evaluate`] found in one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evaluation {
    /// Identity options in the block.
    pub found: usize,
    /// The first [`REPORTED`] of them, in block order.
    pub options: [Option<(HostIdForm, u64)>; REPORTED],
    /// The rule that decided (an index into the rules), if one did.
    pub rule: Option<usize>,
    /// The action: the deciding rule's, or the default if none decided (and options were found).
    pub action: Option<RuleAction>,
    /// Bit `i` set: rule `i` (a `Log` rule) matched.
    pub logged: u32,
    /// The block could not be read to its end, or an identity option was malformed: what follows
    /// the error is unknown, so the caller applies its policy for malformed blocks.
    pub malformed: bool,
}

/// Reads `block` and decides, for a segment that carries identity options, by the first rule
/// (in order) that matches any of them and is not a `Log` rule; `default` if none does. A
/// segment without identity options gets `action: None`. `rules` beyond [`MAX_RULES`] are not
/// read (the configuration refuses more).
pub fn evaluate(
    block: &[u8],
    kinds: HostIdKinds,
    rules: &[HostIdRule],
    default: RuleAction,
) -> Evaluation {
    let rules = &rules[..rules.len().min(MAX_RULES)];
    let mut ev = Evaluation::default();
    // The decision is the first deciding rule in rule order, over all options: a rule earlier
    // in the list wins even if the option it matches comes later in the block.
    let mut best: Option<usize> = None;
    for item in TcpOptions::new(block, kinds) {
        let o = match item {
            Ok(o) => o.option,
            Err(e) => {
                let k = e.kind();
                if e.is_framing()
                    || k == super::kind::EXPERIMENT_1
                    || k == super::kind::EXPERIMENT_2
                    || [kinds.wing, kinds.boucadair, kinds.enabled].contains(&Some(k))
                {
                    ev.malformed = true;
                }
                continue;
            }
        };
        let Some((form, value)) = identity_value(&o) else {
            continue;
        };
        if let Some(slot) = ev.options.get_mut(ev.found) {
            *slot = Some((form, value));
        }
        ev.found += 1;
        for (i, r) in rules.iter().enumerate() {
            if best.is_some_and(|b| b <= i) {
                break;
            }
            if !r.matches(form, value) {
                continue;
            }
            if r.action == RuleAction::Log {
                ev.logged |= 1 << i;
            } else {
                best = Some(i);
                break;
            }
        }
    }
    if ev.found > 0 {
        ev.rule = best;
        ev.action = Some(best.map_or(default, |i| rules[i].action));
        // A log rule after the deciding one was never reached.
        if let Some(b) = best {
            ev.logged &= (1u32 << b).wrapping_sub(1);
        }
    }
    ev
}

/// What an injected option carries (004 §4, §7.1: the host's source port, its IPv6 prefix, or a
/// configured value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InjectData {
    /// The segment's TCP source port.
    SourcePort,
    /// The first 56 bits of the segment's IPv6 source address (004 §4 "the first 56 bits").
    Prefix,
    /// A configured value (a per-host label).
    Label(u64),
}

/// The option a gateway injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InjectForm {
    /// HOST_ID_WING with `bytes` (2, 4 or 8) data bytes: the value's low `bytes` bytes.
    Wing {
        /// 2, 4 or 8.
        bytes: u8,
    },
    /// HOST_ID_BOUCADAIR, origin 0 (source port), 3 (prefix) or 4 (label, 56 bits), lifetime 0.
    Boucadair,
    /// HOST_ID_ENABLED (004 §3.2.2: the SYN of ACK mode).
    Enabled,
}

/// Builds the option bytes into `out` and returns its length, or `None` if `kinds` has no kind
/// for the form, or WING's `bytes` is not 2, 4 or 8.
pub fn build_option(
    form: InjectForm,
    data: InjectData,
    kinds: HostIdKinds,
    src: Ipv6Addr,
    src_port: u16,
    out: &mut [u8; 10],
) -> Option<usize> {
    let value = match data {
        InjectData::SourcePort => u64::from(src_port),
        InjectData::Prefix => u64::from_be_bytes(src.octets()[..8].try_into().ok()?) >> 8,
        InjectData::Label(v) => v,
    };
    match form {
        InjectForm::Wing { bytes } => {
            let n = usize::from(bytes);
            if ![2, 4, 8].contains(&n) {
                return None;
            }
            out[0] = kinds.wing?;
            out[1] = 2 + bytes;
            out[2..2 + n].copy_from_slice(&value.to_be_bytes()[8 - n..]);
            Some(2 + n)
        }
        InjectForm::Boucadair => {
            *out = [kinds.boucadair?, 10, 0, 0, 0, 0, 0, 0, 0, 0];
            match data {
                InjectData::SourcePort => {
                    out[2] = 0;
                    out[3..5].copy_from_slice(&(value as u16).to_be_bytes());
                }
                InjectData::Prefix => {
                    out[2] = 3;
                    out[3..10].copy_from_slice(&value.to_be_bytes()[1..]);
                }
                InjectData::Label(_) => {
                    out[2] = 4;
                    out[3..10].copy_from_slice(&value.to_be_bytes()[1..]);
                }
            }
            Some(10)
        }
        InjectForm::Enabled => {
            out[0] = kinds.enabled?;
            out[1] = 2;
            Some(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    const KINDS: HostIdKinds = HostIdKinds {
        wing: Some(200),
        boucadair: Some(201),
        enabled: Some(202),
    };

    fn rule(
        form: Option<HostIdForm>,
        values: RangeInclusive<u64>,
        action: RuleAction,
    ) -> HostIdRule {
        HostIdRule {
            form,
            values,
            action,
        }
    }

    #[test]
    fn values_by_form() {
        let cases = [
            ("c8043039", HostIdForm::Wing, 0x3039),
            ("c806c0000201", HostIdForm::Wing, 0xc000_0201),
            (
                "c80a20010db800000001",
                HostIdForm::Wing,
                0x2001_0db8_0000_0001,
            ),
            ("c90a001f900000000000", HostIdForm::Boucadair, 0x1f90),
            ("c90a310a000001000000", HostIdForm::Boucadair, 0x0a00_0001),
            (
                "c90a021f900a00000100",
                HostIdForm::Boucadair,
                0x1f90_0a00_0001,
            ),
            (
                "c90a0320010db8000001",
                HostIdForm::Boucadair,
                0x0020_010d_b800_0001,
            ),
            ("ca02", HostIdForm::Enabled, 0),
            ("fe070348 0a0001", HostIdForm::Rfc7974, 0x000a_0001),
            ("fe081f90c0000201", HostIdForm::Toa, 0x1f90_c000_0201),
        ];
        for (block, form, value) in cases {
            let b = hex(block);
            let o = TcpOptions::new(&b, KINDS).next().unwrap().unwrap().option;
            assert_eq!(identity_value(&o), Some((form, value)), "{block}");
        }
        assert_eq!(identity_value(&TcpOption::Mss(1460)), None);
    }

    #[test]
    fn first_deciding_rule_in_rule_order_wins_and_log_rules_do_not_decide() {
        let rules = [
            rule(None, 0..=u64::MAX, RuleAction::Log),
            rule(Some(HostIdForm::Wing), 0x1000..=0x1fff, RuleAction::Drop),
            rule(Some(HostIdForm::Toa), 0..=u64::MAX, RuleAction::Accept),
            rule(Some(HostIdForm::Wing), 0..=u64::MAX, RuleAction::Log),
        ];
        // WING 0x1234 matches the drop; the later TOA accept does not get a say.
        let b = hex("fe081f90c0000201 c8041234");
        let ev = evaluate(&b, KINDS, &rules, RuleAction::Strip);
        assert_eq!(
            (ev.found, ev.rule, ev.action),
            (2, Some(1), Some(RuleAction::Drop))
        );
        assert_eq!(ev.logged, 0b1);
        // WING outside the range: the TOA rule accepts; rule 3 is behind it.
        let b = hex("c8042234 fe081f90c0000201");
        let ev = evaluate(&b, KINDS, &rules, RuleAction::Strip);
        assert_eq!((ev.rule, ev.action), (Some(2), Some(RuleAction::Accept)));
        assert_eq!(ev.logged, 0b1);
        // Only a WING outside the range: the default, both log rules.
        let b = hex("c8042234");
        let ev = evaluate(&b, KINDS, &rules, RuleAction::Strip);
        assert_eq!((ev.rule, ev.action), (None, Some(RuleAction::Strip)));
        assert_eq!(ev.logged, 0b1001);
        assert_eq!(ev.options[0], Some((HostIdForm::Wing, 0x2234)));
        // No identity option: nothing decided, nothing logged.
        let b = hex("020405b4 01030307");
        let ev = evaluate(&b, KINDS, &rules, RuleAction::Strip);
        assert_eq!(
            (ev.found, ev.action, ev.logged, ev.malformed),
            (0, None, 0, false)
        );
    }

    #[test]
    fn unreadable_blocks_and_malformed_identity_options_are_flagged() {
        for block in ["c805000000", "02", "0203", "c90a001f900000000001", "fd02"] {
            let b = hex(block);
            assert!(
                evaluate(&b, KINDS, &[], RuleAction::Strip).malformed,
                "{block}"
            );
        }
        // A malformed option of another kind is not this policy's business.
        let b = hex("1e0300 00");
        assert!(!evaluate(&b, KINDS, &[], RuleAction::Strip).malformed);
    }

    #[test]
    fn built_options_read_back() {
        let src: Ipv6Addr = "2001:db8:1:2::a".parse().unwrap();
        let mut out = [0u8; 10];
        let cases = [
            (
                InjectForm::Wing { bytes: 2 },
                InjectData::SourcePort,
                HostIdForm::Wing,
                40000,
            ),
            (
                InjectForm::Wing { bytes: 8 },
                InjectData::Label(0x0102_0304_0506_0708),
                HostIdForm::Wing,
                0x0102_0304_0506_0708,
            ),
            (
                InjectForm::Boucadair,
                InjectData::SourcePort,
                HostIdForm::Boucadair,
                40000,
            ),
            (
                InjectForm::Boucadair,
                InjectData::Prefix,
                HostIdForm::Boucadair,
                0x0020_010d_b800_0100,
            ),
            (
                InjectForm::Boucadair,
                InjectData::Label(77),
                HostIdForm::Boucadair,
                77,
            ),
            (
                InjectForm::Enabled,
                InjectData::SourcePort,
                HostIdForm::Enabled,
                0,
            ),
        ];
        for (form, data, want, value) in cases {
            let n = build_option(form, data, KINDS, src, 40000, &mut out).unwrap();
            let o = TcpOptions::new(&out[..n], KINDS).next().unwrap().unwrap();
            assert_eq!(
                identity_value(&o.option),
                Some((want, value)),
                "{form:?} {data:?}"
            );
        }
        let none = HostIdKinds::default();
        assert_eq!(
            build_option(
                InjectForm::Enabled,
                InjectData::SourcePort,
                none,
                src,
                1,
                &mut out
            ),
            None
        );
        assert_eq!(
            build_option(
                InjectForm::Wing { bytes: 3 },
                InjectData::SourcePort,
                KINDS,
                src,
                1,
                &mut out
            ),
            None
        );
    }
}
