//! Neighbour entries (`RTM_*NEIGH`, `struct ndmsg`, linux/neighbour.h): proxy entries,
//! pinned (permanent) or reachable entries with a marker, look-up, list, deletion.

use std::net::Ipv6Addr;

use super::{
    is_errno, link_ref, Attrs, Message, Netlink, AF_INET6, NLM_F_CREATE, NLM_F_DUMP, NLM_F_REPLACE,
    RTPROT_STATIC,
};
use crate::error::{OsError, Result};

const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;

const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// `NDA_PROTOCOL` (linux/neighbour.h): who added the entry, like a route's protocol.
const NDA_PROTOCOL: u16 = 12;
const NUD_REACHABLE: u16 = 0x02;
pub(super) const NUD_PERMANENT: u16 = 0x80;
const NTF_PROXY: u8 = 0x08;

/// One IPv6 neighbour entry as listed by [`Netlink::list_neighbors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighInfo {
    pub addr: Ipv6Addr,
    /// The link-layer address, when the entry has one.
    pub lladdr: Option<[u8; 6]>,
    /// `ndm_state` (NUD_* bits).
    pub state: u16,
    /// `NDA_PROTOCOL`: the marker of whoever added it (0 when unset).
    pub proto: u8,
}

/// NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT (linux/neighbour.h): the
/// states whose link-layer address the kernel sends to.
const USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x80;

impl NeighInfo {
    /// The link-layer address, if the entry is in a state that sends to it (not resolving, not
    /// failed).
    pub fn usable_lladdr(&self) -> Option<[u8; 6]> {
        self.lladdr.filter(|_| self.state & USABLE != 0)
    }
}

impl Netlink {
    /// Adds a proxy-NDP entry: interface `index` answers neighbour solicitations for `addr`
    /// (needs `proxy_ndp=1` on it, see [`crate::sysctl`]). Idempotent.
    pub fn add_proxy_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ndmsg(index, NUD_PERMANENT, NTF_PROXY));
        msg.attr(NDA_DST, &addr.octets());
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Neighbor {
                op: "add proxy",
                addr,
                index,
                source,
            })
    }

    /// Deletes a proxy-NDP entry; a missing one is success.
    pub fn del_proxy_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_DELNEIGH, 0);
        msg.push(&ndmsg(index, 0, NTF_PROXY));
        msg.attr(NDA_DST, &addr.octets());
        self.apply(msg, &[libc::ENOENT, libc::ESRCH, libc::ENODEV])
            .map_err(|source| OsError::Neighbor {
                op: "delete proxy",
                addr,
                index,
                source,
            })
    }

    /// Adds (or replaces) the neighbour entry `addr lladdr` on interface `index`, permanent or
    /// reachable (then subject to normal NUD ageing). Idempotent.
    pub fn add_neighbor(
        &mut self,
        index: u32,
        addr: Ipv6Addr,
        lladdr: [u8; 6],
        permanent: bool,
    ) -> Result<()> {
        let state = if permanent {
            NUD_PERMANENT
        } else {
            NUD_REACHABLE
        };
        let mut msg = Message::new(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ndmsg(index, state, 0));
        msg.attr(NDA_DST, &addr.octets());
        msg.attr(NDA_LLADDR, &lladdr);
        if self.marker != RTPROT_STATIC {
            msg.attr(NDA_PROTOCOL, &[self.marker]);
        }
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Neighbor {
                op: "add",
                addr,
                index,
                source,
            })
    }

    /// The link-layer address of the neighbour entry for `addr` on interface `index`, if there
    /// is one in a state that holds a usable address (reachable, stale, delay, probe,
    /// permanent); `None` for no entry, or one still resolving or failed.
    pub fn neighbor_lladdr(&mut self, index: u32, addr: Ipv6Addr) -> Result<Option<[u8; 6]>> {
        let mut msg = Message::new(RTM_GETNEIGH, 0);
        msg.push(&ndmsg(index, 0, 0));
        msg.attr(NDA_DST, &addr.octets());
        let mut found = None;
        let result = self.transact(msg, |ty, payload| {
            if ty != RTM_NEWNEIGH || payload.len() < 12 {
                return;
            }
            let state = u16::from_ne_bytes([payload[8], payload[9]]);
            if state & USABLE != 0 {
                found = Attrs(&payload[12..])
                    .find(|(t, _)| *t == NDA_LLADDR)
                    .and_then(|(_, v)| <[u8; 6]>::try_from(v).ok());
            }
        });
        match result {
            Err(e) if !is_errno(&e, &[libc::ENOENT]) => Err(OsError::Neighbor {
                op: "look up",
                addr,
                index,
                source: e,
            }),
            _ => Ok(found),
        }
    }

    /// Every IPv6 neighbour entry on interface `index` (not the proxy entries).
    pub fn list_neighbors(&mut self, index: u32) -> Result<Vec<NeighInfo>> {
        let mut msg = Message::new(RTM_GETNEIGH, NLM_F_DUMP);
        msg.push(&ndmsg(0, 0, 0));
        let mut out = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty != RTM_NEWNEIGH || payload.len() < 12 || payload[0] != AF_INET6 {
                return;
            }
            let ifindex = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            if ifindex != index || payload[10] & NTF_PROXY != 0 {
                return;
            }
            let state = u16::from_ne_bytes([payload[8], payload[9]]);
            let (mut addr, mut lladdr, mut proto) = (None, None, 0);
            for (t, v) in Attrs(&payload[12..]) {
                match t {
                    NDA_DST => addr = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
                    NDA_LLADDR => lladdr = <[u8; 6]>::try_from(v).ok(),
                    NDA_PROTOCOL => proto = v.first().copied().unwrap_or(0),
                    _ => {}
                }
            }
            if let Some(addr) = addr {
                out.push(NeighInfo {
                    addr,
                    lladdr,
                    state,
                    proto,
                });
            }
        })
        .map_err(|source| OsError::Link {
            op: "list neighbours".into(),
            link: link_ref(index),
            source,
        })?;
        Ok(out)
    }

    /// Deletes the neighbour entry for `addr` on interface `index`; a missing one is success.
    pub fn del_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_DELNEIGH, 0);
        msg.push(&ndmsg(index, 0, 0));
        msg.attr(NDA_DST, &addr.octets());
        self.apply(msg, &[libc::ENOENT, libc::ESRCH, libc::ENODEV])
            .map_err(|source| OsError::Neighbor {
                op: "delete",
                addr,
                index,
                source,
            })
    }
}

/// `struct ndmsg` (12 bytes): family, pad, pad, ifindex, state, flags, type.
fn ndmsg(index: u32, state: u16, flags: u8) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[0] = AF_INET6;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..10].copy_from_slice(&state.to_ne_bytes());
    h[10] = flags;
    h
}
