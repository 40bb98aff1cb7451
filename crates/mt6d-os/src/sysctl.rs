//! IPv6 per-interface sysctls: `/proc/sys/net/ipv6/conf/IFACE/KEY`.
//!
//! The gateway needs `forwarding`, `proxy_ndp`, `accept_dad`, `disable_ipv6` and `accept_ra`.
//! `/proc/sys/net` shows the network namespace of the thread that opens the file, so call these
//! inside [`crate::netns::Netns::run`] to change a namespace's settings. Errors name the file.
//! No `sysctl` subprocess: the file is written directly.

use std::path::PathBuf;

use crate::error::{OsError, Result};

/// The sysctl file for `iface` (an interface name, `all` or `default`) and `key`.
/// The name is used as is (a VLAN `eth0.100` is a directory with a dot in /proc/sys).
pub fn ipv6_conf_path(iface: &str, key: &str) -> Result<PathBuf> {
    let bad = |s: &str| s.is_empty() || s.contains(['/', '\0']) || s == "." || s == "..";
    if bad(iface) || bad(key) {
        return Err(OsError::InvalidArgument(format!(
            "sysctl net.ipv6.conf.{iface}.{key}"
        )));
    }
    Ok(PathBuf::from("/proc/sys/net/ipv6/conf")
        .join(iface)
        .join(key))
}

/// Writes `value` to `net.ipv6.conf.IFACE.KEY`.
pub fn set_ipv6_conf(iface: &str, key: &str, value: &str) -> Result<()> {
    let path = ipv6_conf_path(iface, key)?;
    std::fs::write(&path, value).map_err(|source| OsError::Sysctl {
        op: format!("write {value:?} to"),
        path,
        source,
    })
}

/// Reads `net.ipv6.conf.IFACE.KEY`, trimmed.
pub fn get_ipv6_conf(iface: &str, key: &str) -> Result<String> {
    let path = ipv6_conf_path(iface, key)?;
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(s.trim().to_owned()),
        Err(source) => Err(OsError::Sysctl {
            op: "read".into(),
            path,
            source,
        }),
    }
}

/// Writes `value` to `net.ipv6.neigh.IFACE.KEY` (neighbour discovery settings, e.g.
/// `proxy_delay`, `unres_qlen`).
pub fn set_ipv6_neigh(iface: &str, key: &str, value: &str) -> Result<()> {
    let path = neigh_path(iface, key)?;
    std::fs::write(&path, value).map_err(|source| OsError::Sysctl {
        op: format!("write {value:?} to"),
        path,
        source,
    })
}

/// Reads `net.ipv6.neigh.IFACE.KEY`, trimmed.
pub fn get_ipv6_neigh(iface: &str, key: &str) -> Result<String> {
    let path = neigh_path(iface, key)?;
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| OsError::Sysctl {
            op: "read".into(),
            path,
            source,
        })
}

/// Any sysctl under `/proc/sys/net`, named by its path relative to `/proc/sys` with `/`
/// separators (`net/ipv6/conf/eth0.100/forwarding`: a dotted name is ambiguous once an interface
/// name has a dot). The daemon records the value it found before changing one, keyed by this
/// name, so that a clean-up (even by a later process after a crash) restores exactly it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sysctl(String);

impl Sysctl {
    /// `net.ipv6.conf.IFACE.KEY`.
    pub fn ipv6_conf(iface: &str, key: &str) -> Result<Sysctl> {
        Sysctl::new(&format!("net/ipv6/conf/{iface}/{key}"))
    }

    /// `net.ipv6.neigh.IFACE.KEY`.
    pub fn ipv6_neigh(iface: &str, key: &str) -> Result<Sysctl> {
        Sysctl::new(&format!("net/ipv6/neigh/{iface}/{key}"))
    }

    /// A sysctl by its path under `/proc/sys`; only the `net/` tree, no `.`/`..`/empty parts.
    pub fn new(rel: &str) -> Result<Sysctl> {
        let ok = rel.starts_with("net/")
            && !rel.contains('\0')
            && rel
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !ok {
            return Err(OsError::InvalidArgument(format!("sysctl {rel}")));
        }
        Ok(Sysctl(rel.to_owned()))
    }

    /// The name as given (`net/ipv6/conf/all/forwarding`).
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The file in `/proc/sys`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/proc/sys").join(&self.0)
    }

    /// Reads the value, trimmed.
    pub fn get(&self) -> Result<String> {
        let path = self.path();
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| OsError::Sysctl {
                op: "read".into(),
                path,
                source,
            })
    }

    /// Writes `value`.
    pub fn set(&self, value: &str) -> Result<()> {
        let path = self.path();
        std::fs::write(&path, value).map_err(|source| OsError::Sysctl {
            op: format!("write {value:?} to"),
            path,
            source,
        })
    }
}

fn neigh_path(iface: &str, key: &str) -> Result<PathBuf> {
    // Same validation as the conf tree; only the directory differs.
    let conf = ipv6_conf_path(iface, key)?;
    let rel = conf
        .strip_prefix("/proc/sys/net/ipv6/conf")
        .map_err(|_| OsError::InvalidArgument(format!("sysctl net.ipv6.neigh.{iface}.{key}")))?;
    Ok(PathBuf::from("/proc/sys/net/ipv6/neigh").join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{unique_name, Netns};

    #[test]
    fn rejects_path_tricks() {
        assert!(ipv6_conf_path("..", "forwarding").is_err());
        assert!(ipv6_conf_path("eth0", "../../ipv4/ip_forward").is_err());
        assert_eq!(
            ipv6_conf_path("all", "forwarding").expect("valid"),
            PathBuf::from("/proc/sys/net/ipv6/conf/all/forwarding")
        );
    }

    #[test]
    fn any_net_sysctl_by_path() {
        assert!(Sysctl::new("kernel/core_pattern").is_err());
        assert!(Sysctl::new("net/ipv6/conf/../../kernel/x").is_err());
        assert!(Sysctl::new("net//x").is_err());
        let s = Sysctl::ipv6_conf("eth0.100", "forwarding").expect("valid");
        assert_eq!(s.name(), "net/ipv6/conf/eth0.100/forwarding");
        assert_eq!(
            Sysctl::ipv6_neigh("eth0", "proxy_delay")
                .expect("valid")
                .path(),
            PathBuf::from("/proc/sys/net/ipv6/neigh/eth0/proxy_delay")
        );
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn set_and_get_inside_a_namespace() {
        let ns = Netns::create(&unique_name("sct")).expect("netns");
        ns.run(|| {
            set_ipv6_conf("all", "forwarding", "1").expect("set");
            assert_eq!(get_ipv6_conf("all", "forwarding").expect("get"), "1");
            set_ipv6_conf("lo", "proxy_ndp", "1").expect("set");
            assert_eq!(get_ipv6_conf("lo", "proxy_ndp").expect("get"), "1");
            let e = get_ipv6_conf("nosuchif0", "forwarding").expect_err("missing interface");
            assert!(e
                .to_string()
                .contains("/proc/sys/net/ipv6/conf/nosuchif0/forwarding"));
        })
        .expect("run");
        // The host's setting is untouched by the namespace's.
        let _ = get_ipv6_conf("all", "forwarding").expect("host readable");
    }
}
