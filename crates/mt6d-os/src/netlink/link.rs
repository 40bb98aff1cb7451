//! Links (`RTM_*LINK`, `struct ifinfomsg`, linux/if_link.h and veth.h): look-ups by name and
//! index, state, MTU, MAC address, name, veth pairs, moves between namespaces, deletion.

use std::io;
use std::os::fd::RawFd;

use super::{link_ref, Attrs, Message, Netlink, NLM_F_CREATE, NLM_F_EXCL};
use crate::error::{OsError, Result};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
pub(super) const RTM_GETLINK: u16 = 18;

const IFLA_ADDRESS: u16 = 1;
pub(super) const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_STATS64: u16 = 23;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

/// An interface's drop counters. For a TUN device, `tx_dropped` counts packets the kernel had
/// for the reading process that found the device's queue full, `rx_dropped` packets written to
/// it that the kernel refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkDrops {
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

impl Netlink {
    /// The index of interface `name`.
    pub fn link_index(&mut self, name: &str) -> Result<u32> {
        let ctx = |source| OsError::Link {
            op: "look up index".into(),
            link: name.to_owned(),
            source,
        };
        let mut msg = Message::new(RTM_GETLINK, 0);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, name).map_err(ctx)?;
        let mut index = None;
        self.transact(msg, |_, payload| {
            if let Some(h) = payload.get(4..8) {
                index = Some(u32::from_ne_bytes([h[0], h[1], h[2], h[3]]));
            }
        })
        .map_err(ctx)?;
        index.ok_or_else(|| ctx(io::Error::from_raw_os_error(libc::ENODEV)))
    }

    /// The name of interface `index`.
    pub fn link_name(&mut self, index: u32) -> Result<String> {
        let attrs = self.get_link(index, "look up name")?;
        attrs
            .iter()
            .find(|(t, _)| *t == IFLA_IFNAME)
            .map(|(_, v)| {
                String::from_utf8_lossy(v.split(|&b| b == 0).next().unwrap_or(&[])).into_owned()
            })
            .ok_or_else(|| OsError::Link {
                op: "look up name".into(),
                link: link_ref(index),
                source: io::Error::from(io::ErrorKind::InvalidData),
            })
    }

    /// The link-layer (MAC) address of interface `index`, if it has a 6-byte one (TUN has none).
    pub fn link_mac(&mut self, index: u32) -> Result<Option<[u8; 6]>> {
        let attrs = self.get_link(index, "look up MAC address")?;
        Ok(attrs
            .iter()
            .find(|(t, _)| *t == IFLA_ADDRESS)
            .and_then(|(_, v)| <[u8; 6]>::try_from(v.as_slice()).ok()))
    }

    /// The kernel's drop counters of interface `index` (`struct rtnl_link_stats64`).
    pub fn link_drops(&mut self, index: u32) -> Result<LinkDrops> {
        let attrs = self.get_link(index, "read statistics")?;
        let stats = attrs
            .iter()
            .find(|(t, _)| *t == IFLA_STATS64)
            .map(|(_, v)| v.as_slice())
            .unwrap_or_default();
        // rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors, tx_errors, rx_dropped,
        // tx_dropped, ...: eight-byte fields in that order (linux/if_link.h).
        let field = |i: usize| {
            stats
                .get(i * 8..i * 8 + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_ne_bytes)
        };
        Ok(LinkDrops {
            rx_dropped: field(6),
            tx_dropped: field(7),
        })
    }

    /// Brings interface `index` up.
    pub fn link_set_up(&mut self, index: u32) -> Result<()> {
        self.link_set_flags(index, libc::IFF_UP as u32, libc::IFF_UP as u32, "set up")
    }

    /// Brings interface `index` down.
    pub fn link_set_down(&mut self, index: u32) -> Result<()> {
        self.link_set_flags(index, 0, libc::IFF_UP as u32, "set down")
    }

    /// Sets the MTU of interface `index`.
    pub fn link_set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_MTU, &mtu.to_ne_bytes());
        self.apply(msg, &[]).map_err(|source| OsError::Link {
            op: format!("set mtu {mtu}"),
            link: link_ref(index),
            source,
        })
    }

    /// Sets the link-layer (MAC) address of interface `index`. Most drivers (veth among them)
    /// accept it while the link is up; the others answer EBUSY.
    pub fn link_set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_ADDRESS, &mac);
        self.apply(msg, &[]).map_err(|source| OsError::Link {
            op: format!(
                "set MAC address {}",
                mac.map(|b| format!("{b:02x}")).join(":")
            ),
            link: link_ref(index),
            source,
        })
    }

    /// Renames interface `index` (the kernel requires it to be down).
    pub fn link_rename(&mut self, index: u32, new_name: &str) -> Result<()> {
        let ctx = |source| OsError::Link {
            op: format!("rename to {new_name}"),
            link: link_ref(index),
            source,
        };
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr_str(IFLA_IFNAME, new_name).map_err(ctx)?;
        self.apply(msg, &[]).map_err(ctx)
    }

    /// Creates a veth pair `name` <-> `peer_name` in this socket's namespace; both start down.
    /// Fails with EEXIST if `name` exists (a lab helper: delete and retry).
    pub fn create_veth(&mut self, name: &str, peer_name: &str) -> Result<()> {
        let ctx = |source| OsError::Link {
            op: format!("create veth with peer {peer_name}"),
            link: name.to_owned(),
            source,
        };
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, name).map_err(ctx)?;
        let linkinfo = msg.nest_begin(IFLA_LINKINFO);
        msg.attr(IFLA_INFO_KIND, b"veth");
        let data = msg.nest_begin(IFLA_INFO_DATA);
        let peer = msg.nest_begin(VETH_INFO_PEER);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, peer_name).map_err(ctx)?;
        msg.nest_end(peer);
        msg.nest_end(data);
        msg.nest_end(linkinfo);
        self.apply(msg, &[]).map_err(ctx)
    }

    /// Moves interface `index` into the network namespace open at `netns_fd`
    /// (see [`crate::netns::Netns::fd`]). Its index may change there: look it up by name.
    pub fn move_link_to_netns(&mut self, index: u32, netns_fd: RawFd) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_NET_NS_FD, &(netns_fd as u32).to_ne_bytes());
        self.apply(msg, &[]).map_err(|source| OsError::Link {
            op: "move to another network namespace".into(),
            link: link_ref(index),
            source,
        })
    }

    /// Deletes interface `index`; a link that is already gone is success.
    pub fn delete_link(&mut self, index: u32) -> Result<()> {
        let mut msg = Message::new(RTM_DELLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        self.apply(msg, &[libc::ENODEV, libc::ENOENT])
            .map_err(|source| OsError::Link {
                op: "delete".into(),
                link: link_ref(index),
                source,
            })
    }

    fn link_set_flags(&mut self, index: u32, flags: u32, change: u32, op: &str) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, flags, change));
        self.apply(msg, &[]).map_err(|source| OsError::Link {
            op: op.into(),
            link: link_ref(index),
            source,
        })
    }

    /// RTM_GETLINK for `index`, returning its top-level attributes.
    fn get_link(&mut self, index: u32, op: &str) -> Result<Vec<(u16, Vec<u8>)>> {
        let mut msg = Message::new(RTM_GETLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        let mut attrs = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty == RTM_NEWLINK && payload.len() >= 16 {
                attrs = Attrs(&payload[16..])
                    .map(|(t, v)| (t, v.to_vec()))
                    .collect();
            }
        })
        .map_err(|source| OsError::Link {
            op: op.into(),
            link: link_ref(index),
            source,
        })?;
        Ok(attrs)
    }
}

/// `struct ifinfomsg` (16 bytes): family, pad, type, index, flags, change.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = libc::AF_UNSPEC as u8;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}
