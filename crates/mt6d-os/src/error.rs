//! `OsError`: the one error type of the OS layer.
//!
//! Every variant names the operation that failed and the object it failed on (interface,
//! address, route, path, port), and carries the kernel's `io::Error` as its source, so that a
//! log line like "add address 2001:db8::1/64 on interface #7: File exists" needs no further
//! context. The kernel's answer is part of every message (a person reading a log line has no
//! other way to see it), and interfaces appear by name with their index (`eth0 (#3)`), or by
//! index alone once the interface is gone. Callers that must branch on the kernel's answer (EAGAIN on a read timeout,
//! ENOBUFS on a full queue, EIO from UDP GSO) use [`OsError::raw_os_error`] or
//! [`OsError::is_would_block`] rather than matching on the display string.

use std::io;
use std::net::Ipv6Addr;
use std::path::PathBuf;

/// Result alias of the OS layer.
pub type Result<T, E = OsError> = std::result::Result<T, E>;

/// A failed operating-system operation, with the context needed to act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OsError {
    /// Opening or talking to the rtnetlink socket itself failed.
    #[error("rtnetlink: {op}: {source}")]
    Netlink {
        /// What was being done ("open socket", "receive reply", ...).
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A link (interface) operation failed; `link` is its name or `#index`.
    #[error("{op} on interface {link}: {source}")]
    Link {
        /// The operation ("set up", "set mtu 1400", "look up index", ...).
        op: String,
        /// Interface name, or `#index` when only the index is known.
        link: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Adding, deleting or listing an address failed.
    #[error("{op} address {addr}/{prefix_len} on interface {}: {source}", link(*index))]
    Address {
        /// "add" or "delete".
        op: &'static str,
        /// The address.
        addr: Ipv6Addr,
        /// Its prefix length.
        prefix_len: u8,
        /// Interface index.
        index: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Adding or deleting a route failed.
    #[error("{op} route {dst}/{prefix_len} dev {} table {table}: {source}", link(*oif))]
    Route {
        /// "add" or "delete".
        op: &'static str,
        /// Destination prefix.
        dst: Ipv6Addr,
        /// Destination prefix length.
        prefix_len: u8,
        /// Output interface index.
        oif: u32,
        /// Routing table.
        table: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Adding or deleting a (proxy) neighbour entry failed.
    #[error("{op} neighbour {addr} on interface {}: {source}", link(*index))]
    Neighbor {
        /// "add", "delete", "add proxy", "delete proxy".
        op: &'static str,
        /// The neighbour's address.
        addr: Ipv6Addr,
        /// Interface index.
        index: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Telling the service manager our state (sd_notify) failed.
    #[error("{op} (NOTIFY_SOCKET {socket}): {source}")]
    ServiceManager {
        /// What was being sent.
        op: &'static str,
        /// The socket path the manager gave.
        socket: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Reading or writing a sysctl file failed.
    #[error("{op} {}: {source}", path.display())]
    Sysctl {
        /// "read" or "write VALUE to".
        op: String,
        /// The /proc/sys path.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A network namespace operation failed.
    #[error("network namespace {name}: {op}: {source}")]
    Netns {
        /// The namespace name (as under /run/netns).
        name: String,
        /// The operation.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A TUN device operation failed.
    #[error("TUN device {name}: {op}: {source}")]
    Tun {
        /// Device name.
        name: String,
        /// The operation.
        op: &'static str,
        /// The kernel's (or tun-rs's) answer.
        #[source]
        source: io::Error,
    },

    /// A UDP tunnel socket operation failed.
    #[error("UDP socket [::]:{port}: {op}: {source}")]
    Udp {
        /// The local port.
        port: u16,
        /// The operation.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// An ICMPv6 raw socket operation failed.
    #[error("ICMPv6 socket: {op}: {source}")]
    Icmp {
        /// The operation.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// An epoll operation failed.
    #[error("epoll: {op}: {source}")]
    Epoll {
        /// The operation.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Loading or deleting an nftables ruleset with the `nft` program failed. `source` is the
    /// spawn error (NotFound: the program is missing) or, when `nft` ran and refused, an error
    /// carrying its own message.
    #[error("nftables: {op}: {source}")]
    Nftables {
        /// The operation ("load table inet mt6d_mt6d0", ...).
        op: String,
        /// What went wrong.
        #[source]
        source: io::Error,
    },

    /// A caller passed an argument the OS layer refuses before calling the kernel.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// `name (#index)` of an interface as it is named now, or `#index` if it no longer exists.
fn link(index: u32) -> String {
    match crate::sys::if_name(index) {
        Some(name) => format!("{name} (#{index})"),
        None => format!("#{index}"),
    }
}

impl OsError {
    /// The kernel's errno behind this error, if there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.io_error().and_then(io::Error::raw_os_error)
    }

    /// The underlying `io::Error`, if there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            OsError::Netlink { source, .. }
            | OsError::Link { source, .. }
            | OsError::Address { source, .. }
            | OsError::Route { source, .. }
            | OsError::Neighbor { source, .. }
            | OsError::Sysctl { source, .. }
            | OsError::ServiceManager { source, .. }
            | OsError::Netns { source, .. }
            | OsError::Tun { source, .. }
            | OsError::Udp { source, .. }
            | OsError::Icmp { source, .. }
            | OsError::Epoll { source, .. }
            | OsError::Nftables { source, .. } => Some(source),
            OsError::InvalidArgument(_) => None,
        }
    }

    /// True for EAGAIN/EWOULDBLOCK and EINTR: a read timeout expired, a non-blocking
    /// socket had nothing to do, or a signal interrupted the call. Worker threads treat this as
    /// "check the shutdown flag and try again", not as a failure.
    pub fn is_would_block(&self) -> bool {
        self.io_error().is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_object_and_operation() {
        let e = OsError::Address {
            op: "add",
            addr: "2001:db8::1".parse().expect("literal address"),
            prefix_len: 64,
            index: 1,
            source: io::Error::from_raw_os_error(libc::EEXIST),
        };
        // Index 1 is the loopback device in every network namespace.
        let text = e.to_string();
        assert!(
            text.starts_with("add address 2001:db8::1/64 on interface lo (#1): File exists"),
            "{text}"
        );
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert!(!e.is_would_block());
        let e = OsError::Udp {
            port: 4242,
            op: "recvmmsg",
            source: io::Error::from_raw_os_error(libc::EAGAIN),
        };
        assert!(e.is_would_block());
    }

    #[test]
    fn every_message_carries_the_kernel_answer_and_names_the_interface() {
        let e = OsError::Link {
            op: "look up index".into(),
            link: "eth9".into(),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        };
        assert_eq!(
            e.to_string(),
            "look up index on interface eth9: No such device (os error 19)"
        );
        let e = OsError::Route {
            op: "add",
            dst: "2001:db8:b::".parse().expect("literal address"),
            prefix_len: 64,
            oif: 1,
            table: 254,
            source: io::Error::from_raw_os_error(libc::ENETUNREACH),
        };
        assert_eq!(
            e.to_string(),
            "add route 2001:db8:b::/64 dev lo (#1) table 254: Network is unreachable (os error 101)"
        );
        // A vanished interface is still named by its index.
        let e = OsError::Neighbor {
            op: "add proxy",
            addr: "2001:db8::1".parse().expect("literal address"),
            index: 0x7fff_fff0,
            source: io::Error::from_raw_os_error(libc::ENODEV),
        };
        assert_eq!(
            e.to_string(),
            "add proxy neighbour 2001:db8::1 on interface #2147483632: No such device (os error 19)"
        );
        let e = OsError::Udp {
            port: 27589,
            op: "bind",
            source: io::Error::from_raw_os_error(libc::EADDRINUSE),
        };
        assert_eq!(
            e.to_string(),
            "UDP socket [::]:27589: bind: Address already in use (os error 98)"
        );
    }
}
