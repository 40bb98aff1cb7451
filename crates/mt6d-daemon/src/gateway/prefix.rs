//! Prefix arithmetic shared by the kernel set-up (`system`: on-link routes to the peers' hashed
//! /64s) and the quiet-link table (`quiet`: the sets of hashed /64s), so that neither imports
//! the other for it.

use std::net::Ipv6Addr;

/// The /64 containing `addr`.
pub fn slash64(addr: Ipv6Addr) -> Ipv6Addr {
    let s = addr.segments();
    Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0)
}
