//! `[tcp]` (MSS clamping and the kinds of 004's HOST_ID options, for the whole gateway) and each
//! peer's `host_id_out` / `host_id_in` policy: what the gateway does with the identity options
//! of the TCP segments it forwards (docs/CONFIG.md, "TCP identity options").

use std::net::Ipv4Addr;

use mt6d_proto::scrub::{
    HostIdForm, HostIdKinds, HostIdRule, InjectData, InjectForm, RuleAction, ScrubPolicy, MAX_RULES,
};
use serde::Deserialize;
use toml::Spanned;

use super::source::Source;
use super::ConfigError;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTcp {
    pub(super) mss_clamp: Option<Spanned<bool>>,
    pub(super) host_id: Option<Spanned<bool>>,
    pub(super) wing_kind: Option<Spanned<i64>>,
    pub(super) boucadair_kind: Option<Spanned<i64>>,
    pub(super) enabled_kind: Option<Spanned<i64>>,
    pub(super) strip_unknown: Option<Spanned<bool>>,
    pub(super) normalize: Option<Spanned<bool>>,
    pub(super) hop_limit: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHostId {
    action: Option<Spanned<String>>,
    malformed: Option<Spanned<String>>,
    log: Option<Spanned<bool>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
    inject: Option<Spanned<RawInject>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    option: Option<Spanned<String>>,
    value: Option<Spanned<toml::Value>>,
    range: Option<Spanned<Vec<Spanned<toml::Value>>>>,
    action: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInject {
    option: Spanned<String>,
    data: Option<Spanned<String>>,
    label: Option<Spanned<toml::Value>>,
    bytes: Option<Spanned<i64>>,
    mode: Option<Spanned<String>>,
}

/// `[tcp]`: settings of every forwarded TCP segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Lower the MSS of SYNs (both directions) to what the tunnel carries (default on).
    pub mss_clamp: bool,
    /// Apply the peers' identity policies (default on). Off, options pass untouched and no
    /// peer may have a `host_id_out` / `host_id_in` table; with `mss_clamp` off too, the
    /// packet threads do not look at TCP at all.
    pub host_id: bool,
    /// The HOST_ID kinds and whether unknown options go too.
    pub scrub: ScrubPolicy,
    /// Normalise the protected hosts' stack fingerprint (off by default).
    pub normalize: Option<Normalize>,
}

/// `normalize = true`: what every protected host's packets are made to say about its stack
/// (docs/ARCHITECTURE.md, "SYN fingerprint normalisation").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalize {
    /// The hop limit of every packet from the protected side (`hop_limit`, default 64).
    pub hop_limit: u8,
}

/// The normalised SYN window, in segments of the SYN's MSS: RFC 6928's initial window, which a
/// sender cannot exceed before the first window update anyway, and p0f's `mss*10` of Linux.
pub const NORMAL_WINDOW_SEGMENTS: u16 = 10;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss_clamp: true,
            host_id: true,
            scrub: ScrubPolicy::default(),
            normalize: None,
        }
    }
}

/// 004 §3.2.1 / §3.2.2: where the injected option goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectMode {
    /// In the SYN.
    Syn,
    /// HOST_ID_ENABLED in the SYN; HOST_ID_BOUCADAIR in the first ACK after a SYN-ACK that
    /// returned HOST_ID_ENABLED.
    Ack,
}

/// What the gateway injects into its protected hosts' segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inject {
    pub form: InjectForm,
    pub data: InjectData,
    pub mode: InjectMode,
}

/// One peer's policy for one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdPolicy {
    /// What a segment with identity options gets when no rule decides (default `strip`).
    pub default: RuleAction,
    /// Drop segments whose option block cannot be read or whose identity option is malformed
    /// (default); `false` forwards them untouched.
    pub drop_malformed: bool,
    /// Log every segment with an identity option (rate-limited).
    pub log: bool,
    /// Ordered rules (at most [`MAX_RULES`]).
    pub rules: Vec<HostIdRule>,
    /// Injection (`host_id_out` only).
    pub inject: Option<Inject>,
}

impl Default for HostIdPolicy {
    fn default() -> Self {
        HostIdPolicy {
            default: RuleAction::Strip,
            drop_malformed: true,
            log: false,
            rules: Vec::new(),
            inject: None,
        }
    }
}

pub(super) fn parse_tcp(
    src: &Source,
    raw: Option<&Spanned<RawTcp>>,
) -> Result<TcpConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(TcpConfig::default());
    };
    let t = raw.get_ref();
    let kind = |v: &Option<Spanned<i64>>| -> Result<Option<u8>, ConfigError> {
        v.as_ref()
            .map(|k| {
                u8::try_from(*k.get_ref()).map_err(|_| src.err(k, "a TCP option kind is 0 to 255"))
            })
            .transpose()
    };
    let kinds = HostIdKinds {
        wing: kind(&t.wing_kind)?,
        boucadair: kind(&t.boucadair_kind)?,
        enabled: kind(&t.enabled_kind)?,
    };
    if let Some(k) = kinds.conflict() {
        let at = [&t.wing_kind, &t.boucadair_kind, &t.enabled_kind]
            .into_iter()
            .flatten()
            .find(|v| *v.get_ref() == i64::from(k))
            .map_or(raw.span(), |v| v.span());
        return Err(src.err_at(
            at,
            format!("option kind {k} cannot be a HOST_ID kind: 0-8 have standard meanings, 253/254 are shared experiments told apart by ExID, and each form needs its own kind"),
        ));
    }
    let hop_limit = match &t.hop_limit {
        None => 64,
        Some(h) => u8::try_from(*h.get_ref())
            .ok()
            .filter(|&h| h > 0)
            .ok_or_else(|| src.err(h, "hop_limit is 1 to 255"))?,
    };
    let normalize = t.normalize.as_ref().is_some_and(|v| *v.get_ref());
    if let (false, Some(h)) = (normalize, &t.hop_limit) {
        return Err(src.err(h, "hop_limit applies only with normalize = true"));
    }
    Ok(TcpConfig {
        normalize: normalize.then_some(Normalize { hop_limit }),
        mss_clamp: t.mss_clamp.as_ref().is_none_or(|v| *v.get_ref()),
        host_id: t.host_id.as_ref().is_none_or(|v| *v.get_ref()),
        scrub: ScrubPolicy {
            host_id_kinds: kinds,
            strip_unknown: t.strip_unknown.as_ref().is_some_and(|v| *v.get_ref()),
        },
    })
}

/// A `host_id_out` / `host_id_in` table; `outbound` allows `inject`.
pub(super) fn parse_policy(
    src: &Source,
    raw: Option<&Spanned<RawHostId>>,
    tcp: &TcpConfig,
    outbound: bool,
) -> Result<HostIdPolicy, ConfigError> {
    let Some(raw) = raw else {
        return Ok(HostIdPolicy::default());
    };
    if !tcp.host_id {
        return Err(src.err(
            raw,
            "a host_id_out / host_id_in table needs [tcp] host_id = true (it is false)",
        ));
    }
    let h = raw.get_ref();
    let mut policy = HostIdPolicy::default();
    if let Some(a) = &h.action {
        policy.default = match a.get_ref().as_str() {
            "strip" => RuleAction::Strip,
            "accept" => RuleAction::Accept,
            "drop" => RuleAction::Drop,
            other => {
                return Err(src.err(
                    a,
                    format!(
                        "action {other:?}: the default action is \"strip\", \"accept\" or \"drop\""
                    ),
                ))
            }
        };
    }
    if let Some(m) = &h.malformed {
        policy.drop_malformed = match m.get_ref().as_str() {
            "drop" => true,
            "accept" => false,
            other => {
                return Err(src.err(
                    m,
                    format!("malformed {other:?}: \"drop\" (the default) or \"accept\""),
                ))
            }
        };
    }
    policy.log = h.log.as_ref().is_some_and(|v| *v.get_ref());
    if h.rule.len() > MAX_RULES {
        return Err(src.err(
            &h.rule[MAX_RULES],
            format!("at most {MAX_RULES} rules per direction"),
        ));
    }
    for r in &h.rule {
        policy.rules.push(rule(src, r)?);
    }
    if let Some(i) = &h.inject {
        if !outbound {
            return Err(src.err(
                i,
                "inject is for host_id_out: a gateway speaks for the hosts behind it, not for the peer's",
            ));
        }
        policy.inject = Some(inject(src, i, tcp.scrub.host_id_kinds)?);
    }
    Ok(policy)
}

fn form(src: &Source, v: &Spanned<String>) -> Result<Option<HostIdForm>, ConfigError> {
    Ok(Some(match v.get_ref().as_str() {
        "any" => return Ok(None),
        "wing" => HostIdForm::Wing,
        "boucadair" => HostIdForm::Boucadair,
        "enabled" => HostIdForm::Enabled,
        "rfc7974" => HostIdForm::Rfc7974,
        "toa" => HostIdForm::Toa,
        other => {
            return Err(src.err(
                v,
                format!("option {other:?}: one of \"wing\", \"boucadair\", \"enabled\", \"rfc7974\", \"toa\", \"any\""),
            ))
        }
    }))
}

/// A value: an integer, or a string holding a decimal or `0x` hexadecimal number or an IPv4
/// address (its 32 bits, as 004 §8.4 matches a private source address).
fn value(src: &Source, v: &Spanned<toml::Value>) -> Result<u64, ConfigError> {
    let bad = || {
        src.err(
            v,
            "a HOST_ID value is a non-negative integer, or a string: decimal, 0x hexadecimal (up to 64 bits) or an IPv4 address",
        )
    };
    match v.get_ref() {
        toml::Value::Integer(i) => u64::try_from(*i).map_err(|_| bad()),
        toml::Value::String(s) => {
            if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                u64::from_str_radix(&hex.replace('_', ""), 16).map_err(|_| bad())
            } else if let Ok(a) = s.parse::<Ipv4Addr>() {
                Ok(u64::from(u32::from(a)))
            } else {
                s.parse().map_err(|_| bad())
            }
        }
        _ => Err(bad()),
    }
}

fn rule(src: &Source, r: &Spanned<RawRule>) -> Result<HostIdRule, ConfigError> {
    let raw = r.get_ref();
    let form = raw
        .option
        .as_ref()
        .map(|o| form(src, o))
        .transpose()?
        .flatten();
    let values = match (&raw.value, &raw.range) {
        (Some(_), Some(range)) => {
            return Err(src.err(range, "a rule has a value or a range, not both"))
        }
        (Some(v), None) => {
            let v = value(src, v)?;
            v..=v
        }
        (None, Some(range)) => match range.get_ref().as_slice() {
            [lo, hi] => {
                let (l, h) = (value(src, lo)?, value(src, hi)?);
                if l > h {
                    return Err(src.err(range, "range [low, high] with low > high"));
                }
                l..=h
            }
            _ => return Err(src.err(range, "range is [low, high]")),
        },
        (None, None) => 0..=u64::MAX,
    };
    let action = match raw.action.get_ref().as_str() {
        "accept" => RuleAction::Accept,
        "drop" => RuleAction::Drop,
        "strip" => RuleAction::Strip,
        "log" => RuleAction::Log,
        other => {
            return Err(src.err(
                &raw.action,
                format!("action {other:?}: one of \"accept\", \"drop\", \"strip\", \"log\""),
            ))
        }
    };
    Ok(HostIdRule {
        form,
        values,
        action,
    })
}

fn inject(src: &Source, i: &Spanned<RawInject>, kinds: HostIdKinds) -> Result<Inject, ConfigError> {
    let raw = i.get_ref();
    let mode = match raw.mode.as_ref().map(|m| m.get_ref().as_str()) {
        None | Some("syn") => InjectMode::Syn,
        Some("ack") => InjectMode::Ack,
        Some(other) => {
            return Err(src.err(
                raw.mode.as_ref().unwrap_or(&raw.option),
                format!("mode {other:?}: \"syn\" (004 §3.2.1) or \"ack\" (§3.2.2)"),
            ))
        }
    };
    let data = match raw.data.as_ref().map(|d| d.get_ref().as_str()) {
        None | Some("source_port") => InjectData::SourcePort,
        Some("prefix") => InjectData::Prefix,
        Some("label") => {
            let l = raw
                .label
                .as_ref()
                .ok_or_else(|| src.err(i, "data = \"label\" needs label = VALUE"))?;
            InjectData::Label(value(src, l)?)
        }
        Some(other) => {
            return Err(src.err(
                raw.data.as_ref().unwrap_or(&raw.option),
                format!("data {other:?}: \"source_port\", \"prefix\" or \"label\""),
            ))
        }
    };
    if raw.label.is_some() && !matches!(data, InjectData::Label(_)) {
        return Err(src.err(i, "label is only read with data = \"label\""));
    }
    let (form, kind) = match raw.option.get_ref().as_str() {
        "wing" => {
            let bytes = match &raw.bytes {
                None => 2,
                Some(b) if [2, 4, 8].contains(b.get_ref()) => *b.get_ref() as u8,
                Some(b) => {
                    return Err(src.err(b, "HOST_ID_WING carries 2, 4 or 8 bytes (004 §3.1, §6)"))
                }
            };
            (InjectForm::Wing { bytes }, kinds.wing)
        }
        "boucadair" => (InjectForm::Boucadair, kinds.boucadair),
        "enabled" => (InjectForm::Enabled, kinds.enabled),
        other => {
            return Err(src.err(
                &raw.option,
                format!(
                    "inject option {other:?}: \"wing\", \"boucadair\" or \"enabled\" (004's forms)"
                ),
            ))
        }
    };
    if raw.bytes.is_some() && !matches!(form, InjectForm::Wing { .. }) {
        return Err(src.err(i, "bytes is only read for option = \"wing\""));
    }
    if kind.is_none() {
        return Err(src.err(
            &raw.option,
            format!(
                "inject {:?} needs its kind in [tcp] ({}_kind): 004 leaves it TBD",
                raw.option.get_ref(),
                raw.option.get_ref()
            ),
        ));
    }
    if mode == InjectMode::Ack {
        if form != InjectForm::Boucadair {
            return Err(src.err(
                &raw.option,
                "mode = \"ack\" injects HOST_ID_BOUCADAIR in the ACK (004 §3.2.2): option = \"boucadair\"",
            ));
        }
        if kinds.enabled.is_none() {
            return Err(src.err(
                i,
                "mode = \"ack\" announces with HOST_ID_ENABLED: set enabled_kind in [tcp]",
            ));
        }
    }
    Ok(Inject { form, data, mode })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use crate::config::{Config, ConfigError, InjectMode};
    use mt6d_proto::scrub::{HostIdForm, InjectData, InjectForm, RuleAction};
    use std::path::Path;

    const BASE: &str = r#"
[gateway]
internal_interface = "eth1"
external_interface = "eth0"
"#;
    const PEER: &str = r#"
[[peer]]
name = "b"
local_host = "2001:db8:1::a"
remote_host = "2001:db8:1::b"
key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
"#;

    fn parse(tcp: &str, peer_tail: &str) -> Result<Config, ConfigError> {
        let text = format!("{BASE}{tcp}{PEER}{peer_tail}");
        Config::parse(Path::new("/etc/mt6d/gw.toml"), &text)
    }

    #[test]
    fn defaults_clamp_and_strip() {
        let cfg = parse("", "").unwrap();
        assert!(cfg.gateway.tcp.mss_clamp);
        assert_eq!(cfg.gateway.tcp.normalize, None);
        let [out, inn] = &cfg.peers[0].host_id;
        for p in [out, inn] {
            assert_eq!(p.default, RuleAction::Strip);
            assert!(p.drop_malformed && !p.log && p.rules.is_empty() && p.inject.is_none());
        }
    }

    #[test]
    fn rules_and_injection_parse() {
        let cfg = parse(
            "[tcp]\nmss_clamp = false\nwing_kind = 200\nboucadair_kind = 201\nenabled_kind = 202\n",
            r#"
[peer.host_id_out]
action = "accept"
malformed = "accept"
log = true
inject = { option = "boucadair", data = "prefix", mode = "ack" }
[[peer.host_id_out.rule]]
option = "wing"
range = ["0x1000", 8191]
action = "drop"
[[peer.host_id_out.rule]]
option = "toa"
value = "192.0.2.1"
action = "log"
[[peer.host_id_out.rule]]
action = "strip"
[peer.host_id_in]
action = "drop"
"#,
        )
        .unwrap();
        assert!(!cfg.gateway.tcp.mss_clamp);
        assert_eq!(cfg.gateway.tcp.scrub.host_id_kinds.wing, Some(200));
        for (tcp, want) in [
            ("normalize = true\n", 64),
            ("normalize = true\nhop_limit = 128\n", 128),
        ] {
            let cfg = parse(&format!("[tcp]\n{tcp}"), "").unwrap();
            assert_eq!(
                cfg.gateway.tcp.normalize,
                Some(crate::config::Normalize { hop_limit: want })
            );
        }
        let [out, inn] = &cfg.peers[0].host_id;
        assert_eq!(out.default, RuleAction::Accept);
        assert!(!out.drop_malformed && out.log);
        assert_eq!(out.rules.len(), 3);
        assert_eq!(out.rules[0].form, Some(HostIdForm::Wing));
        assert_eq!(out.rules[0].values, 0x1000..=0x1fff);
        assert_eq!(out.rules[1].values, 0xc000_0201..=0xc000_0201);
        assert_eq!(out.rules[1].action, RuleAction::Log);
        assert_eq!(
            (out.rules[2].form, out.rules[2].values.clone()),
            (None, 0..=u64::MAX)
        );
        let inj = out.inject.unwrap();
        assert_eq!(
            (inj.form, inj.data, inj.mode),
            (InjectForm::Boucadair, InjectData::Prefix, InjectMode::Ack)
        );
        assert_eq!(inn.default, RuleAction::Drop);
    }

    #[test]
    fn host_id_off_parses_and_refuses_a_policy_table() {
        let cfg = parse("[tcp]\nhost_id = false\nmss_clamp = false\n", "").unwrap();
        assert!(!cfg.gateway.tcp.host_id && !cfg.gateway.tcp.mss_clamp);
        assert!(parse("", "").unwrap().gateway.tcp.host_id);
        let err = parse(
            "[tcp]\nhost_id = false\n",
            "[peer.host_id_out]\naction = \"accept\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("needs [tcp] host_id = true"), "{err}");
    }

    #[test]
    fn mistakes_are_refused_at_their_line() {
        let kinds = "[tcp]\nwing_kind = 200\n";
        for (tcp, tail, want) in [
            (
                "[tcp]\nwing_kind = 2\n",
                "",
                "option kind 2 cannot be a HOST_ID kind",
            ),
            (
                "[tcp]\nwing_kind = 200\nenabled_kind = 200\n",
                "",
                "option kind 200",
            ),
            ("[tcp]\nwing_kind = 300\n", "", "0 to 255"),
            ("[tcp]\nhop_limit = 64\n", "", "only with normalize = true"),
            ("[tcp]\nnormalize = true\nhop_limit = 0\n", "", "1 to 255"),
            ("[tcp]\nnormalize = true\nhop_limit = 256\n", "", "1 to 255"),
            (
                kinds,
                "[peer.host_id_out]\naction = \"log\"\n",
                "the default action",
            ),
            (
                kinds,
                "[[peer.host_id_out.rule]]\noption = \"wong\"\naction = \"drop\"\n",
                "option \"wong\"",
            ),
            (
                kinds,
                "[[peer.host_id_out.rule]]\nrange = [5, 1]\naction = \"drop\"\n",
                "low > high",
            ),
            (
                kinds,
                "[[peer.host_id_out.rule]]\nvalue = -1\naction = \"drop\"\n",
                "non-negative",
            ),
            (
                kinds,
                "[peer.host_id_in.inject]\noption = \"wing\"\n",
                "inject is for host_id_out",
            ),
            (
                kinds,
                "[peer.host_id_out.inject]\noption = \"enabled\"\n",
                "enabled_kind",
            ),
            (
                kinds,
                "[peer.host_id_out.inject]\noption = \"wing\"\nbytes = 3\n",
                "2, 4 or 8",
            ),
            (
                kinds,
                "[peer.host_id_out.inject]\noption = \"wing\"\nmode = \"ack\"\n",
                "mode = \"ack\"",
            ),
            (
                kinds,
                "[peer.host_id_out.inject]\noption = \"wing\"\ndata = \"label\"\n",
                "needs label",
            ),
        ] {
            let err = parse(tcp, tail).expect_err(want).to_string();
            assert!(err.contains(want), "{err} (wanted {want:?})");
            assert!(err.starts_with("/etc/mt6d/gw.toml:"), "{err}");
        }
    }
}
