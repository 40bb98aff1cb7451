//! What `mt6d run` needs from the kernel's privilege model, checked before anything is touched:
//! two capabilities, not uid 0 (docs/CONFIG.md "Running without root").
//!
//! - `CAP_NET_ADMIN`: the TUN device (`TUNSETIFF`), addresses, routes and neighbour entries over
//!   rtnetlink, `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`, and the sysctls under `/proc/sys/net`. Those
//!   files are owned by root with mode 0644, but the kernel grants a holder of `CAP_NET_ADMIN` in
//!   the network namespace's user namespace the owner's permissions on them
//!   (`net_ctl_permissions`, net/sysctl_net.c), so no file set-up is needed.
//! - `CAP_NET_RAW`: the raw ICMPv6 sockets (errors from the path, router and neighbour
//!   discovery) and the AF_PACKET watch of the external link.
//!
//! - The TUN device node `/dev/net/tun` must be readable and writable by the daemon's user:
//!   capabilities do not bypass file permissions (that would take `CAP_DAC_OVERRIDE`). udev's
//!   default rule makes it 0666 on the common distributions; where it is 0600, give the
//!   daemon's user access with a udev rule (`KERNEL=="tun", GROUP="mt6d", MODE="0660"`).
//!
//! Not needed: `CAP_NET_BIND_SERVICE` (tunnel ports are 1024 and above, `PortPolicy`), nor any
//! file capability: the daemon reads its config and key files as whatever user it runs as, so
//! they must be readable by that user (and, for secrets, by no one else).

use std::fmt;

/// A capability by its number in `linux/capability.h` and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    pub bit: u32,
    pub name: &'static str,
    pub why: &'static str,
}

/// What `mt6d run` needs.
pub const NEEDED: [Capability; 2] = [
    Capability {
        bit: 12,
        name: "CAP_NET_ADMIN",
        why: "TUN device, addresses, routes, neighbour entries, sysctls under /proc/sys/net",
    },
    Capability {
        bit: 13,
        name: "CAP_NET_RAW",
        why: "raw ICMPv6 and packet sockets",
    },
];

/// Capabilities the process lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing(pub Vec<Capability>);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mt6d run lacks ")?;
        for (i, c) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { " and " };
            write!(f, "{sep}{} ({})", c.name, c.why)?;
        }
        write!(
            f,
            "; run it as root, or as its own user with exactly CAP_NET_ADMIN and CAP_NET_RAW \
             (systemd: AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW; by hand: setpriv \
             --reuid=USER --regid=GROUP --init-groups --inh-caps=+net_admin,+net_raw \
             --ambient-caps=+net_admin,+net_raw mt6d run -c FILE)"
        )
    }
}

impl std::error::Error for Missing {}

/// The effective capability set from the text of `/proc/self/status` (`CapEff:` in hex).
fn effective(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

fn missing_from(status: &str) -> Missing {
    // Unreadable: assume nothing, and say which would be needed.
    let eff = effective(status).unwrap_or(0);
    Missing(
        NEEDED
            .iter()
            .copied()
            .filter(|c| eff & (1u64 << c.bit) == 0)
            .collect(),
    )
}

/// Why `mt6d run` cannot work with this process's privileges.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrivilegeError {
    #[error(transparent)]
    Capabilities(#[from] Missing),
    #[error(
        "open {path}: {source}; the TUN device node must be readable and writable by the \
         daemon's user (udev's usual mode is 0666; or a udev rule: KERNEL==\"tun\", \
         GROUP=\"mt6d\", MODE=\"0660\")"
    )]
    TunDevice {
        path: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The TUN clone device: opening it creates nothing (that takes `TUNSETIFF`).
const TUN_DEVICE: &str = "/dev/net/tun";

/// Both checks, before anything is touched: the capabilities ([`check_run`]), then access to
/// the TUN device node.
pub fn check_all() -> Result<(), PrivilegeError> {
    check_run()?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(TUN_DEVICE)
        .map(drop)
        .map_err(|source| PrivilegeError::TunDevice {
            path: TUN_DEVICE,
            source,
        })
}

/// Checks that this process holds every capability in [`NEEDED`] (uid 0 does not matter: root
/// without `CAP_NET_ADMIN`, as in some containers, is refused too; a plain user with both is not).
pub fn check_run() -> Result<(), Missing> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let missing = missing_from(&status);
    if missing.0.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str =
        "Name:\tmt6d\nUid:\t65534\t65534\t65534\t65534\nCapInh:\t0000000000003000\n\
CapPrm:\t0000000000003000\nCapEff:\t{}\nCapBnd:\t000001ffffffffff\n";

    fn with(eff: &str) -> String {
        STATUS.replace("{}", eff)
    }

    #[test]
    fn capabilities_not_uid_decide() {
        assert_eq!(missing_from(&with("0000000000003000")).0, vec![]);
        assert_eq!(missing_from(&with("000001ffffffffff")).0, vec![]);
        assert_eq!(missing_from(&with("0000000000001000")).0, vec![NEEDED[1]]);
        assert_eq!(missing_from(&with("0000000000000000")).0, NEEDED.to_vec());
        assert_eq!(missing_from("garbage").0, NEEDED.to_vec());
        let text = missing_from(&with("0000000000002000")).to_string();
        assert!(
            text.starts_with("mt6d run lacks CAP_NET_ADMIN (TUN"),
            "{text}"
        );
        assert!(!text.contains("CAP_NET_RAW (raw"), "{text}");
        assert!(text.contains("AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW"));
    }

    #[test]
    fn this_process_is_checked_without_panicking() {
        let _ = check_run();
    }
}
