//! Link events: an rtnetlink socket subscribed to `RTMGRP_LINK`, so the daemon learns at once
//! that an interface it uses was deleted, renamed, set down or created (rtnetlink(7)).
//!
//! Non-blocking; [`LinkEvents::poll`] drains what arrived. Every message is parsed with checked
//! slicing: a short or odd message is skipped, never a panic.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::error::{OsError, Result};
use crate::sys;

const RTMGRP_LINK: u32 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const IFLA_IFNAME: u16 = 3;
const NLMSG_HDR: usize = 16;
const IFINFO: usize = 16;
const IFF_UP: u32 = 0x1;
/// IFF_LOWER_UP: the carrier is there (linux/if.h).
const IFF_LOWER_UP: u32 = 0x1_0000;

/// One link message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEvent {
    pub index: u32,
    /// The name in the message (empty if it had none).
    pub name: String,
    /// RTM_DELLINK: the link is gone.
    pub deleted: bool,
    /// Administratively up with a carrier.
    pub up: bool,
}

/// The subscribed socket.
#[derive(Debug)]
pub struct LinkEvents {
    fd: OwnedFd,
    buf: Vec<u8>,
}

fn ctx(op: &'static str) -> impl FnOnce(io::Error) -> OsError {
    move |source| OsError::Netlink { op, source }
}

impl LinkEvents {
    /// Subscribes to link events of the calling thread's network namespace.
    pub fn open() -> Result<LinkEvents> {
        let fd = sys::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE)
            .map_err(ctx("open link event socket"))?;
        sys::bind_netlink_groups(fd.as_fd(), RTMGRP_LINK)
            .map_err(ctx("subscribe to link events"))?;
        sys::set_nonblocking(fd.as_fd(), true)
            .map_err(ctx("set link event socket non-blocking"))?;
        Ok(LinkEvents {
            fd,
            buf: vec![0; 32 * 1024],
        })
    }

    /// The events received since the last call. ENOBUFS (the kernel dropped events because we
    /// were slow) is reported as an error: the caller must then look the links up itself.
    pub fn poll(&mut self) -> Result<Vec<LinkEvent>> {
        let mut out = Vec::new();
        loop {
            match sys::recv(self.fd.as_fd(), &mut self.buf, libc::MSG_DONTWAIT) {
                Ok(0) => break,
                Ok(n) => parse_messages(self.buf.get(..n).unwrap_or(&[]), &mut out),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ctx("receive link events")(e)),
            }
        }
        Ok(out)
    }
}

impl std::os::fd::AsRawFd for LinkEvents {
    /// The socket, readable when events arrived (for an epoll set).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses a datagram of netlink messages, keeping the link ones.
pub fn parse_messages(mut b: &[u8], out: &mut Vec<LinkEvent>) {
    while b.len() >= NLMSG_HDR {
        let Some(len) = u32_at(b, 0).map(|l| l as usize) else {
            return;
        };
        let Some(kind) = u16_at(b, 4) else { return };
        if len < NLMSG_HDR || len > b.len() {
            return;
        }
        if kind == RTM_NEWLINK || kind == RTM_DELLINK {
            if let Some(ev) = parse_link(&b[NLMSG_HDR..len], kind == RTM_DELLINK) {
                out.push(ev);
            }
        }
        let next = (len + 3) & !3;
        b = b.get(next..).unwrap_or(&[]);
    }
}

fn parse_link(b: &[u8], deleted: bool) -> Option<LinkEvent> {
    let index = u32_at(b, 4)?;
    let flags = u32_at(b, 8)?;
    let mut name = String::new();
    let mut attrs = b.get(IFINFO..)?;
    while attrs.len() >= 4 {
        let len = usize::from(u16_at(attrs, 0)?);
        let kind = u16_at(attrs, 2)?;
        if len < 4 || len > attrs.len() {
            break;
        }
        if kind == IFLA_IFNAME {
            let v = &attrs[4..len];
            let v = v.split(|c| *c == 0).next().unwrap_or(v);
            name = String::from_utf8_lossy(v).into_owned();
        }
        attrs = attrs.get((len + 3) & !3..).unwrap_or(&[]);
    }
    Some(LinkEvent {
        index,
        name,
        deleted,
        up: !deleted && flags & IFF_UP != 0 && flags & IFF_LOWER_UP != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, index: u32, flags: u32, name: &str) -> Vec<u8> {
        let mut attr = Vec::new();
        let alen = 4 + name.len() + 1;
        attr.extend_from_slice(&(alen as u16).to_ne_bytes());
        attr.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
        attr.extend_from_slice(name.as_bytes());
        attr.push(0);
        while attr.len() % 4 != 0 {
            attr.push(0);
        }
        let len = NLMSG_HDR + IFINFO + attr.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[0, 0, 1, 0]);
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&attr);
        m
    }

    #[test]
    fn new_and_deleted_links_are_parsed_and_truncation_is_harmless() {
        let mut b = message(RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP, "ext0");
        b.extend(message(RTM_DELLINK, 4, 0, "eth9"));
        b.extend(message(RTM_NEWLINK, 5, IFF_UP, "eth1"));
        let mut out = Vec::new();
        parse_messages(&b, &mut out);
        assert_eq!(
            out,
            vec![
                LinkEvent {
                    index: 3,
                    name: "ext0".into(),
                    deleted: false,
                    up: true
                },
                LinkEvent {
                    index: 4,
                    name: "eth9".into(),
                    deleted: true,
                    up: false
                },
                LinkEvent {
                    index: 5,
                    name: "eth1".into(),
                    deleted: false,
                    up: false
                },
            ]
        );
        for cut in 0..b.len() {
            let mut out = Vec::new();
            parse_messages(&b[..cut], &mut out);
            assert!(out.len() <= 3);
        }
    }
}
