//! IPv6 addresses (`RTM_*ADDR`, `struct ifaddrmsg`, linux/if_addr.h): add with flags and
//! marker, delete, list.

use std::io;
use std::net::Ipv6Addr;

use super::{
    link_ref, Attrs, Message, Netlink, AF_INET6, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE,
    RTPROT_STATIC, RT_SCOPE_UNIVERSE,
};
use crate::error::{OsError, Result};

pub(super) const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
pub(super) const IFA_FLAGS: u16 = 8;
/// `IFA_PROTO` (Linux 6.1): who added the address; an older kernel ignores it.
const IFA_PROTO: u16 = 11;
pub(super) const IFA_F_NODAD: u32 = 0x02;
const IFA_F_DADFAILED: u32 = 0x08;
const IFA_F_TENTATIVE: u32 = 0x40;
const IFA_F_NOPREFIXROUTE: u32 = 0x200;

/// Flags for [`Netlink::add_address`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrFlags {
    /// `IFA_F_NODAD`: usable at once, no duplicate address detection. Hashed addresses rotate
    /// every few seconds and cannot wait the ~1 s DAD takes.
    pub nodad: bool,
    /// `IFA_F_NOPREFIXROUTE`: do not add a route for the prefix.
    pub noprefixroute: bool,
}

/// One IPv6 address as listed by [`Netlink::list_addresses`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrInfo {
    /// The address.
    pub addr: Ipv6Addr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// DAD has not finished: the kernel will not yet use it as a source.
    pub tentative: bool,
    /// DAD found a duplicate.
    pub dadfailed: bool,
    /// `IFA_PROTO`: the marker of whoever added it (0 when unset or on kernels before 6.1).
    pub proto: u8,
}

impl Netlink {
    /// Adds (or updates the flags of) `addr/prefix_len` on interface `index`. Idempotent.
    pub fn add_address(
        &mut self,
        index: u32,
        addr: Ipv6Addr,
        prefix_len: u8,
        flags: AddrFlags,
    ) -> Result<()> {
        let ctx = |source| OsError::Address {
            op: "add",
            addr,
            prefix_len,
            index,
            source,
        };
        if prefix_len > 128 {
            return Err(ctx(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let mut ifa_flags = 0u32;
        if flags.nodad {
            ifa_flags |= IFA_F_NODAD;
        }
        if flags.noprefixroute {
            ifa_flags |= IFA_F_NOPREFIXROUTE;
        }
        let mut msg = Message::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ifaddrmsg(index, prefix_len, ifa_flags as u8));
        msg.attr(IFA_LOCAL, &addr.octets());
        msg.attr(IFA_ADDRESS, &addr.octets());
        msg.attr(IFA_FLAGS, &ifa_flags.to_ne_bytes());
        if self.marker != RTPROT_STATIC {
            msg.attr(IFA_PROTO, &[self.marker]);
        }
        self.apply(msg, &[libc::EEXIST]).map_err(ctx)
    }

    /// Deletes `addr/prefix_len` from interface `index`; an address that is not there is success.
    pub fn del_address(&mut self, index: u32, addr: Ipv6Addr, prefix_len: u8) -> Result<()> {
        let mut msg = Message::new(RTM_DELADDR, 0);
        msg.push(&ifaddrmsg(index, prefix_len, 0));
        msg.attr(IFA_LOCAL, &addr.octets());
        msg.attr(IFA_ADDRESS, &addr.octets());
        self.apply(msg, &[libc::ENOENT, libc::EADDRNOTAVAIL, libc::ENODEV])
            .map_err(|source| OsError::Address {
                op: "delete",
                addr,
                prefix_len,
                index,
                source,
            })
    }

    /// The IPv6 addresses on interface `index`.
    pub fn list_addresses(&mut self, index: u32) -> Result<Vec<AddrInfo>> {
        let mut msg = Message::new(RTM_GETADDR, NLM_F_DUMP);
        msg.push(&ifaddrmsg(0, 0, 0));
        let mut out = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty != RTM_NEWADDR || payload.len() < 8 || payload[0] != AF_INET6 {
                return;
            }
            let ifa_index = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            if ifa_index != index {
                return;
            }
            let mut flags = u32::from(payload[2]);
            let mut addr = None;
            let mut proto = 0;
            for (t, v) in Attrs(&payload[8..]) {
                match t {
                    IFA_ADDRESS => addr = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
                    // IFA_FLAGS carries all 32 bits; ifa_flags only the low 8.
                    IFA_FLAGS => {
                        if let Ok(b) = <[u8; 4]>::try_from(v) {
                            flags = u32::from_ne_bytes(b);
                        }
                    }
                    IFA_PROTO => proto = v.first().copied().unwrap_or(0),
                    _ => {}
                }
            }
            if let Some(addr) = addr {
                out.push(AddrInfo {
                    addr,
                    prefix_len: payload[1],
                    tentative: flags & IFA_F_TENTATIVE != 0,
                    dadfailed: flags & IFA_F_DADFAILED != 0,
                    proto,
                });
            }
        })
        .map_err(|source| OsError::Link {
            op: "list addresses".into(),
            link: link_ref(index),
            source,
        })?;
        Ok(out)
    }
}

/// `struct ifaddrmsg` (8 bytes): family, prefixlen, flags, scope, index.
pub(super) fn ifaddrmsg(index: u32, prefix_len: u8, flags: u8) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0] = AF_INET6;
    h[1] = prefix_len;
    h[2] = flags;
    h[3] = RT_SCOPE_UNIVERSE;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h
}
