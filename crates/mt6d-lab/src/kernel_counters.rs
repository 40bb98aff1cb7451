//! The kernel's drop and error counters of one namespace, for the tests and the bench that
//! check a run lost nothing outside the daemon's own counters: IPv6/UDP/ICMPv6 counters from
//! `net/snmp6` and each interface's receive and transmit drops and errors from `net/dev`.

use std::collections::BTreeMap;

use mt6d_os::Netns;

/// The `net/snmp6` counter names that count a drop or error (matched as substrings).
pub const DROP_NAMES: [&str; 6] = [
    "Discards",
    "Errors",
    "NoRoutes",
    "NoPorts",
    "Truncated",
    "Fails",
];

/// The `net/snmp6` counters whose name contains one of `snmp6_names` (e.g. "Discards",
/// "Errors"), keyed by that name, and each interface's `rx_errs`, `rx_drop`, `tx_errs` and
/// `tx_drop`, keyed `"<interface> <counter>"`. Unreadable files give no entries.
pub fn kernel_drops(ns: &Netns, snmp6_names: &[&str]) -> mt6d_os::Result<BTreeMap<String, u64>> {
    let (snmp6, dev) = ns.run(|| {
        (
            std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap_or_default(),
            std::fs::read_to_string("/proc/thread-self/net/dev").unwrap_or_default(),
        )
    })?;
    Ok(parse(&snmp6, &dev, snmp6_names))
}

fn parse(snmp6: &str, dev: &str, snmp6_names: &[&str]) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for line in snmp6.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        if snmp6_names.iter().any(|d| k.contains(d)) {
            all.insert(k.to_owned(), v);
        }
    }
    // "  name: rx_bytes rx_packets rx_errs rx_drop ... tx_bytes tx_packets tx_errs tx_drop ..."
    for line in dev.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let v: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() < 12 {
            continue;
        }
        for (i, what) in [
            (2, "rx_errs"),
            (3, "rx_drop"),
            (10, "tx_errs"),
            (11, "tx_drop"),
        ] {
            all.insert(format!("{} {what}", name.trim()), v[i]);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_both_files() {
        let snmp6 = "Ip6InReceives 10\nIp6InDiscards 2\nUdp6RcvbufErrors 3\nUdp6InDatagrams 7\n";
        let dev = "Inter-|   Receive\n face |bytes\n  \
                   veth0: 100 2 4 5 0 0 0 0 200 3 6 7 0 0 0 0\n";
        let got = parse(snmp6, dev, &["Discards", "Errors"]);
        let want: BTreeMap<String, u64> = [
            ("Ip6InDiscards", 2),
            ("Udp6RcvbufErrors", 3),
            ("veth0 rx_errs", 4),
            ("veth0 rx_drop", 5),
            ("veth0 tx_errs", 6),
            ("veth0 tx_drop", 7),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(got, want);
    }
}
