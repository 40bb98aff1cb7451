//! Nothing the gateway's kernel says on the public link ties epochs together (docs/PROTOCOL.md
//! §5.4; the promise "unlinkable on the wire"): the mt6d-owned nftables table and the random link
//! identity of the external interface. [`super::system`] applies both and records how to undo
//! them; this module says what they are.
//!
//! The kernel, left alone, answers for the hashed addresses in ways that name several epochs at
//! once or a future one: an ICMPv6 Redirect or Destination Unreachable for a late packet to an
//! address just removed quotes that packet (an old epoch) and goes to the sender's current
//! address; an MLDv2 report joins the next address's solicited-node group an interval before
//! use and leaves an old one in the same message; a host's own Router Solicitations carry its
//! MAC. Each rule below removes one of these; ARCHITECTURE.md lists them with the sysctls.
//!
//! What this module must not do: touch the tunnel's own packets (UDP between hashed addresses,
//! and the neighbour discovery that carries them) or anything of the host's own traffic that
//! does not name a hashed prefix.

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use mt6d_os::nftables::{quoted_interface, NftTable};

use super::error::GatewayError;
use super::prefix::slash64;
use crate::config::{Config, PeerConfig};

/// The table of one daemon instance: `inet mt6d_<TUN name>` (the TUN name is unique per
/// instance on a host, so two daemons never share a table).
pub fn table(cfg: &Config) -> Result<NftTable, GatewayError> {
    NftTable::new(&table_name(&cfg.gateway.tun_name)).map_err(|source| GatewayError::Os {
        what: "nftables table name".into(),
        source,
    })
}

/// The name of the nftables table of the instance with TUN device `tun`.
pub fn table_name(tun: &str) -> String {
    let tun: String = tun
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("mt6d_{tun}")
}

/// The hashed /64s of every peer: (local prefixes, remote prefixes), each listed once.
pub fn hashed_prefixes(peers: &[&PeerConfig]) -> (Vec<Ipv6Addr>, Vec<Ipv6Addr>) {
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    for p in peers {
        let s = &p.stream;
        for (list, ep) in [(&mut local, &s.local), (&mut remote, &s.remote)] {
            let prefix = ep
                .external_prefix
                .map_or_else(|| slash64(ep.true_addr), slash64);
            if !list.contains(&prefix) {
                list.push(prefix);
            }
        }
    }
    (local, remote)
}

/// The first 64 bits of `prefix` as an nft hexadecimal constant, for raw payload matches.
fn hex64(prefix: Ipv6Addr) -> String {
    let o = prefix.octets();
    let mut s = String::from("0x");
    for b in &o[..8] {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The body of the table (its chains), for `external` and the hashed prefixes. `host`: mt6d
/// runs on the protected host, whose own Router Solicitations must not leave either.
pub fn ruleset(
    external: &str,
    local: &[Ipv6Addr],
    remote: &[Ipv6Addr],
    host: bool,
) -> Result<String, GatewayError> {
    let ext = quoted_interface(external).map_err(|source| GatewayError::Os {
        what: "external_interface in an nftables rule".into(),
        source,
    })?;
    let set = |list: &[Ipv6Addr], f: fn(Ipv6Addr) -> String| {
        list.iter().map(|p| f(*p)).collect::<Vec<_>>().join(", ")
    };
    let local_nets = set(local, |p| format!("{p}/64"));
    let mut all: Vec<Ipv6Addr> = local.to_vec();
    // One segment: both sides hash into the same /64, listed once (nft refuses duplicates).
    all.extend(remote.iter().filter(|p| !local.contains(p)));
    let all64 = set(&all, hex64);
    let errors = "destination-unreachable, packet-too-big, time-exceeded, parameter-problem";
    let mut rs = String::new();
    if host {
        // The host's kernel solicits routers from its own MAC and (EUI-64) link-local address,
        // with a backoff that never stops (RFC 7559); 001's host mode leaked them.
        rs = format!("\t\toifname {ext} icmpv6 type nd-router-solicit drop\n");
    }
    // Priorities: prerouting before the kernel routes (and so forwards, redirects or answers)
    // the packet; the others at the filter priority, where they see every packet of their hook.
    Ok(format!(
        "\tchain prerouting {{
\t\ttype filter hook prerouting priority -300; policy accept;
\t\t# A packet for one of our hashed /64s that is no bound address (a late packet for an
\t\t# address already removed, or a guess) is dropped before it can be forwarded back out,
\t\t# redirected, or resolved with neighbour discovery.
\t\tiifname {ext} ip6 daddr {{ {local_nets} }} fib daddr type != local drop
\t}}
\tchain forward {{
\t\ttype filter hook forward priority 0; policy accept;
\t\t# The public link is never routed back onto itself.
\t\tiifname {ext} oifname {ext} drop
\t}}
\tchain output {{
\t\ttype filter hook output priority 0; policy accept;
\t\t# Redirects: the gateway sends none on the public link.
\t\toifname {ext} icmpv6 type nd-redirect drop
\t\t# Errors that quote a packet from or to a hashed /64 (source at ICMPv6 byte 16, destination
\t\t# at byte 32 of the error): they would name old and current epochs in one message.
\t\toifname {ext} icmpv6 type {{ {errors} }} @th,128,64 {{ {all64} }} drop
\t\toifname {ext} icmpv6 type {{ {errors} }} @th,256,64 {{ {all64} }} drop
\t\t# MLD: reports join the next address's solicited-node group an interval early and leave
\t\t# old ones in the same message.
\t\toifname {ext} icmpv6 type {{ mld-listener-report, mld-listener-done, mld2-listener-report }} drop
{rs}\t}}"
    ))
}

/// A random unicast, locally administered MAC address (IEEE 802: bit 0 of the first octet
/// clear = unicast, bit 1 set = locally administered, so it never equals a vendor's address).
pub fn random_mac() -> Result<[u8; 6], GatewayError> {
    let mut mac = [0u8; 6];
    getrandom::fill(&mut mac)
        .map_err(|e| GatewayError::Setup(format!("random MAC address: {e}")))?;
    mac[0] = (mac[0] & 0xfc) | 0x02;
    Ok(mac)
}

/// A random link-local address fe80::/64 with a random 64-bit interface identifier (RFC 8981
/// §3.3.1 style: no bit derived from the MAC; the u bit cleared as RFC 7136 allows).
pub fn random_link_local() -> Result<Ipv6Addr, GatewayError> {
    let mut iid = [0u8; 8];
    getrandom::fill(&mut iid)
        .map_err(|e| GatewayError::Setup(format!("random link-local address: {e}")))?;
    iid[0] &= 0xfd;
    let mut o = [0u8; 16];
    o[0] = 0xfe;
    o[1] = 0x80;
    o[8..].copy_from_slice(&iid);
    Ok(Ipv6Addr::from(o))
}

/// How long MLD may still repeat a report after the last group change on `external`: the
/// report interval (`mldv2_unsolicited_report_interval`, 1 s by default) plus a margin, at most
/// 2 s. A missing sysctl (interface gone) waits the default.
pub fn mld_repeat_window(external: &str) -> std::time::Duration {
    let get = |k: &str| {
        mt6d_os::sysctl::get_ipv6_conf(external, k)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
    };
    // MLDv1 (forced, or an MLDv1 querier on the link) has its own interval; MLDv2 otherwise.
    let key = if get("force_mld_version") == Some(1) {
        "mldv1_unsolicited_report_interval"
    } else {
        "mldv2_unsolicited_report_interval"
    };
    let ms = get(key).unwrap_or(1000);
    std::time::Duration::from_millis(ms.min(2000) + 200)
}

/// fe80::/10.
pub fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().expect("literal")
    }

    #[test]
    fn ruleset_names_the_interface_and_every_hashed_prefix() {
        let r =
            ruleset("ext0", &[a("2001:db8:a::")], &[a("2001:db8:b::")], false).expect("ruleset");
        assert!(r.contains(
            "iifname \"ext0\" ip6 daddr { 2001:db8:a::/64 } fib daddr type != local drop"
        ));
        assert!(r.contains("iifname \"ext0\" oifname \"ext0\" drop"));
        assert!(r.contains("@th,128,64 { 0x20010db8000a0000, 0x20010db8000b0000 } drop"));
        assert!(r.contains("@th,256,64 { 0x20010db8000a0000, 0x20010db8000b0000 } drop"));
        assert!(r.contains("mld2-listener-report } drop"));
        assert!(
            !r.contains("nd-router-solicit"),
            "gateway mode keeps its one RS"
        );
        let host =
            ruleset("ext0", &[a("2001:db8:1::")], &[a("2001:db8:1::")], true).expect("ruleset");
        assert!(host.contains("oifname \"ext0\" icmpv6 type nd-router-solicit drop"));
        assert!(ruleset("ext\"0", &[], &[], false).is_err());
    }

    #[test]
    fn random_identity_is_unicast_local_and_link_local() {
        for _ in 0..64 {
            let mac = random_mac().expect("entropy");
            assert_eq!(mac[0] & 0x03, 0x02, "{mac:02x?}");
            let ll = random_link_local().expect("entropy");
            assert!(is_link_local(&ll));
            assert_eq!(ll.segments()[1..4], [0, 0, 0]);
            assert_eq!(ll.octets()[8] & 0x02, 0);
        }
        assert_ne!(
            random_mac().expect("entropy"),
            random_mac().expect("entropy")
        );
    }
}
