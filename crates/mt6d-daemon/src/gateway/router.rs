//! Router discovery on both links (000 §3.2.3; docs/PROTOCOL.md §5.3): the protected hosts learn
//! an MTU that accounts for the tunnel overhead, and nothing about them reaches the public
//! network.
//!
//! The `mt6d-router` thread owns a raw ICMPv6 socket that passes only Router Solicitations and
//! Router Advertisements (hop limit 255 required both ways, RFC 4861 §6.1):
//! - On the **internal** link it is the router: it multicasts Router Advertisements carrying the
//!   link MTU of the tunnel ([`PathState::link_mtu`]: external MTU, or the MTU the external
//!   router advertises, minus the overhead) on the schedule of
//!   [`mt6d_proto::router::RouterAdvertiser`], at once when that MTU changes, and answers the
//!   hosts' Router Solicitations. The advertisements come from the internal interface's
//!   link-local address with its MAC, router lifetime 0 (not a default router: the remote hosts
//!   are reached on-link through proxy neighbour entries), no prefixes.
//! - On the **external** link it only listens: a default router's MTU option lowers the
//!   tunnel MTU ([`PathState::upstream_mtu`]) for as long as its router lifetime
//!   ([`UpstreamRouters`]); an advertisement with router lifetime 0 (any node on the link can
//!   send one) sets nothing and is counted as `nd_not_default_router`. At start it sends one Router Solicitation of its
//!   own, from the external interface's link-local address (the gateway's, chosen by the kernel),
//!   so a router answers at once rather than in up to ten minutes. The hosts' own solicitations are link-local multicast and never leave the
//!   internal link: the gateway is a router, not a bridge, so no host's MAC or true address is
//!   ever sent to the public network, solicitations included (000 drops and regenerates them).
//!
//! Everything received is validated ([`RouterMessage::new_checked`], hop limit, source) and
//! counted by outcome; nothing here panics on what the network sent, and nothing is logged per
//! message.

use std::net::Ipv6Addr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mt6d_os::{Icmp6Socket, Netlink};
use mt6d_proto::router::{RouterAdvertiser, UpstreamRouters};
use mt6d_proto::wire::{
    router_advertisement, router_solicitation, RouterMessage, ROUTER_ADVERTISEMENT,
    ROUTER_SOLICITATION,
};

use super::error::GatewayError;
use super::path::{PathState, RouterCounters};
use super::shared::Shared;
use crate::daemon::clock;

/// All-nodes and all-routers link-local multicast groups.
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// How often the thread wakes without messages (shutdown flag, schedule, MTU changes).
const TICK: Duration = Duration::from_millis(100);
/// How often a missing internal link-local address is looked for again.
const SOURCE_RETRY: Duration = Duration::from_secs(1);

/// The router thread's own resources.
#[derive(Debug)]
pub struct RouterDiscovery {
    socket: Icmp6Socket,
    netlink: Netlink,
    internal_index: u32,
    external_index: u32,
    internal_mac: [u8; 6],
    /// The internal interface's link-local address, once it has one that passed DAD.
    source: Option<Ipv6Addr>,
    last_source_lookup: Option<Instant>,
    advertiser: Option<RouterAdvertiser>,
    /// The external link's default routers and their MTUs.
    upstream: UpstreamRouters,
}

fn os(what: &str) -> impl FnOnce(mt6d_os::OsError) -> GatewayError {
    let what = what.to_string();
    move |source| GatewayError::Os { what, source }
}

fn link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// Any uniformly random number for the advertisement schedule (its jitter is not a secret; a
/// failing entropy source only makes the schedule regular).
fn random() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_ne_bytes(b)
}

impl RouterDiscovery {
    /// Opens the socket. Fails only if the socket cannot be had; a missing link-local address
    /// on the internal interface (still in DAD, or disabled) is waited for in the thread.
    pub fn open(internal_index: u32, external_index: u32) -> Result<RouterDiscovery, GatewayError> {
        let mut netlink = Netlink::open().map_err(os("open rtnetlink for router discovery"))?;
        let internal_mac = netlink
            .link_mac(internal_index)
            .map_err(os("internal interface MAC"))?
            .ok_or_else(|| {
                GatewayError::Setup(
                    "the internal interface has no link-layer address to advertise; set \
                     router_advertisements = false"
                        .into(),
                )
            })?;
        let socket = Icmp6Socket::open().map_err(os("open router discovery socket"))?;
        socket
            .set_filter_pass_only(&[ROUTER_SOLICITATION, ROUTER_ADVERTISEMENT])
            .map_err(os("router discovery socket filter"))?;
        socket
            .set_hop_limit(255)
            .map_err(os("router discovery hop limit"))?;
        socket
            .set_read_timeout(Some(TICK))
            .map_err(os("router discovery socket timeout"))?;
        Ok(RouterDiscovery {
            socket,
            netlink,
            internal_index,
            external_index,
            internal_mac,
            source: None,
            last_source_lookup: None,
            advertiser: None,
            upstream: UpstreamRouters::default(),
        })
    }

    /// Runs until `shared.shutdown`.
    pub fn run(mut self, shared: &Shared, path: &PathState, counters: &RouterCounters) {
        // One solicitation upstream, about the gateway only (its own link-local source, no
        // options): a router there answers with its MTU now rather than in up to ten minutes.
        if let Err(e) = self.socket.send_via(
            &router_solicitation(),
            ALL_ROUTERS,
            None,
            self.external_index,
        ) {
            log::debug!("router solicitation on the external link: {e}");
        }
        let mut buf = [0u8; 1500];
        while !shared.shutdown.load(Relaxed) {
            if let Ok(info) = self.socket.recv_from(&mut buf) {
                let msg = &buf[..info.len.min(buf.len())];
                self.receive(msg, &info, path, counters);
            }
            self.advertise(path, counters);
        }
    }

    fn receive(
        &mut self,
        msg: &[u8],
        info: &mt6d_os::IcmpRecvInfo,
        path: &PathState,
        counters: &RouterCounters,
    ) {
        let Ok(m) = RouterMessage::new_checked(msg) else {
            return counters.drop("nd_malformed");
        };
        // RFC 4861 §6.1: a router discovery message with any other hop limit crossed a router.
        if info.hop_limit != Some(255) {
            return counters.drop("nd_hop_limit");
        }
        match (m.is_advertisement(), info.ifindex) {
            (true, i) if i == self.external_index => {
                // §6.1.2: advertisements come from a link-local address.
                if !link_local(&info.src) {
                    return counters.drop("nd_bad_source");
                }
                counters.upstream_advertisements.fetch_add(1, Relaxed);
                let lifetime = m.router_lifetime();
                if lifetime == 0 {
                    counters.drop("nd_not_default_router");
                }
                // A lifetime 0 from a router we listed also ends its MTU.
                let now = clock::now();
                self.upstream
                    .on_advertisement(now, info.src, lifetime, m.mtu());
                // The ICMPv6 thread folds it into the tunnel MTU within a second.
                path.upstream_mtu
                    .store(self.upstream.mtu(now).unwrap_or(0), Relaxed);
            }
            (false, i) if i == self.internal_index => {
                // §6.1.1: from the unspecified address, no link-layer address option.
                let unspecified = info.src.is_unspecified();
                if !(link_local(&info.src) || unspecified)
                    || (unspecified && m.source_lladdr().is_some())
                {
                    return counters.drop("nd_bad_source");
                }
                let Some(adv) = self.advertiser.as_mut() else {
                    return; // no link-local address yet: cannot advertise at all
                };
                if let Some(to) = adv.on_solicitation(clock::now(), info.src, random()) {
                    if self.send(to, path, counters) {
                        counters.solicitations_answered.fetch_add(1, Relaxed);
                    }
                }
            }
            // Our own advertisements loop back on the internal link, and our own solicitation on
            // the external one; another router's advertisement inside, or another node's
            // solicitation outside, is none of our business either.
            (true, i) if i == self.internal_index => {}
            (false, i) if i == self.external_index => {}
            _ => counters.drop("nd_other_interface"),
        }
    }

    /// Sends what the schedule asks for, and follows the link MTU.
    fn advertise(&mut self, path: &PathState, counters: &RouterCounters) {
        // A default router's MTU lapses with its lifetime, heard from again or not.
        path.upstream_mtu
            .store(self.upstream.mtu(clock::now()).unwrap_or(0), Relaxed);
        if self.source.is_none() && !self.find_source() {
            return;
        }
        let now = clock::now();
        let mtu = path.link_mtu.load(Relaxed);
        let adv = self
            .advertiser
            .get_or_insert_with(|| RouterAdvertiser::new(now, mtu));
        adv.set_mtu(now, mtu);
        // The schedule's randomness only when something is due: no syscall every tick.
        if now >= adv.next_due() && adv.poll(now, random()) {
            self.send(ALL_NODES, path, counters);
        }
    }

    fn send(&mut self, to: Ipv6Addr, path: &PathState, counters: &RouterCounters) -> bool {
        let (Some(src), Some(adv)) = (self.source, &self.advertiser) else {
            return false;
        };
        let mtu = adv.mtu();
        let msg = router_advertisement(self.internal_mac, mtu);
        match self
            .socket
            .send_via(&msg, to, Some(src), self.internal_index)
        {
            Ok(_) => {
                counters.advertisements_sent.fetch_add(1, Relaxed);
                if counters.advertised_mtu.swap(mtu, Relaxed) != mtu {
                    log::info!(
                        "advertising MTU {mtu} on the internal link (tunnel MTU {})",
                        path.tunnel_mtu.load(Relaxed)
                    );
                }
                true
            }
            Err(e) => {
                // The internal link went down or lost its address: look again.
                log::debug!("router advertisement to {to}: {e}");
                self.source = None;
                false
            }
        }
    }

    /// Looks for the internal interface's usable link-local address (at most once a second).
    fn find_source(&mut self) -> bool {
        if self
            .last_source_lookup
            .is_some_and(|t| t.elapsed() < SOURCE_RETRY)
        {
            return false;
        }
        let first = self.last_source_lookup.is_none();
        self.last_source_lookup = Some(Instant::now());
        self.source = self
            .netlink
            .list_addresses(self.internal_index)
            .ok()
            .and_then(|list| {
                list.into_iter()
                    .find(|a| link_local(&a.addr) && !a.tentative && !a.dadfailed)
                    .map(|a| a.addr)
            });
        if self.source.is_none() && first {
            log::warn!(
                "the internal interface has no usable link-local address yet; router \
                 advertisements wait for one"
            );
        }
        self.source.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_means_fe80_slash_10() {
        let a = |s: &str| s.parse::<Ipv6Addr>().expect("literal");
        assert!(link_local(&a("fe80::1")));
        assert!(link_local(&a("febf::1")));
        assert!(!link_local(&a("fec0::1")));
        assert!(!link_local(&a("2001:db8::1")));
    }
}
