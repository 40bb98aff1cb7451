//! When a gateway advertises the tunnel MTU to its protected hosts (000 §3.2.3; docs/PROTOCOL.md
//! §5.3): the timing rules of RFC 4861 §6.2.4-6.2.6 for a router that sends Router
//! Advertisements on its internal link, as a sans-IO state machine. Time and randomness come in
//! as arguments; the caller sends what [`RouterAdvertiser::poll`] and
//! [`RouterAdvertiser::on_solicitation`] ask for.
//!
//! - Unsolicited advertisements: the first [`INITIAL_ADVERTISEMENTS`] at most
//!   [`INITIAL_INTERVAL_MS`] apart, then every 200-600 s (uniformly at random).
//! - A change of the advertised MTU is announced at once (the hosts should not wait minutes to
//!   stop sending packets the tunnel cannot carry), subject to the multicast spacing below.
//! - A solicitation from a host with an address is answered unicast at once, at most
//!   [`UNICAST_PER_SECOND`] times a second (the rest wait for the next multicast). A solicitation
//!   from the unspecified address is answered by a multicast after a random 0-500 ms.
//! - Two multicast advertisements are at least [`MIN_MULTICAST_GAP_MS`] apart.
//!
//! On the external link the gateway only listens, and [`UpstreamRouters`] decides what an
//! advertisement's MTU option is worth: only a default router's (router lifetime > 0, RFC 4861
//! §6.3.4: a host takes parameters from the routers it uses), for as long as that lifetime.

use std::net::Ipv6Addr;

use crate::UnixTime;

/// Unsolicited advertisements sent quickly after start (RFC 4861 MAX_INITIAL_RTR_ADVERTISEMENTS).
pub const INITIAL_ADVERTISEMENTS: u8 = 3;
/// Their spacing (MAX_INITIAL_RTR_ADVERT_INTERVAL).
pub const INITIAL_INTERVAL_MS: u64 = 16_000;
/// Least and most time between later unsolicited advertisements (MinRtrAdvInterval,
/// MaxRtrAdvInterval defaults).
pub const INTERVAL_MS: (u64, u64) = (200_000, 600_000);
/// Least time between two multicast advertisements (MIN_DELAY_BETWEEN_RAS).
pub const MIN_MULTICAST_GAP_MS: u64 = 3_000;
/// Most delay of a multicast answer to a solicitation (MAX_RA_DELAY_TIME).
pub const MAX_ANSWER_DELAY_MS: u64 = 500;
/// Unicast answers per second, at most.
pub const UNICAST_PER_SECOND: u32 = 10;

const MS: u64 = 1_000_000;

/// The advertising schedule of one internal link.
#[derive(Debug, Clone)]
pub struct RouterAdvertiser {
    mtu: u32,
    initial_left: u8,
    next_multicast: UnixTime,
    last_multicast: Option<UnixTime>,
    unicast_window: (u64, u32),
}

fn after(t: UnixTime, ms: u64) -> UnixTime {
    UnixTime::from_nanos(t.as_nanos().saturating_add(ms.saturating_mul(MS)))
}

impl RouterAdvertiser {
    /// Starts advertising `mtu`; the first multicast is due at once.
    pub fn new(now: UnixTime, mtu: u32) -> RouterAdvertiser {
        RouterAdvertiser {
            mtu,
            initial_left: INITIAL_ADVERTISEMENTS,
            next_multicast: now,
            last_multicast: None,
            unicast_window: (0, 0),
        }
    }

    /// The MTU to put in every advertisement.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// A new MTU to advertise: if it differs, a multicast advertisement is due as soon as the
    /// spacing allows.
    pub fn set_mtu(&mut self, now: UnixTime, mtu: u32) {
        if mtu != self.mtu {
            self.mtu = mtu;
            self.due_by(self.earliest_multicast(now));
        }
    }

    /// A Router Solicitation arrived from `src` (already validated: hop limit 255, source
    /// unspecified or link-local). Returns the address to answer unicast now, if any; otherwise a
    /// multicast answer is scheduled. `random` is any uniformly random number.
    pub fn on_solicitation(
        &mut self,
        now: UnixTime,
        src: Ipv6Addr,
        random: u32,
    ) -> Option<Ipv6Addr> {
        if !src.is_unspecified() {
            let second = now.as_nanos() / 1_000_000_000;
            if self.unicast_window.0 != second {
                self.unicast_window = (second, 0);
            }
            if self.unicast_window.1 < UNICAST_PER_SECOND {
                self.unicast_window.1 += 1;
                return Some(src);
            }
        }
        let delay = u64::from(random) % (MAX_ANSWER_DELAY_MS + 1);
        let at = after(now, delay).max(self.earliest_multicast(now));
        self.due_by(at);
        None
    }

    /// True if a multicast advertisement is due now; the caller sends it. `random` picks the
    /// following interval.
    pub fn poll(&mut self, now: UnixTime, random: u32) -> bool {
        if now < self.next_multicast {
            return false;
        }
        self.last_multicast = Some(now);
        self.initial_left = self.initial_left.saturating_sub(1);
        let interval = if self.initial_left > 0 {
            INITIAL_INTERVAL_MS
        } else {
            let (lo, hi) = INTERVAL_MS;
            lo + u64::from(random) % (hi - lo + 1)
        };
        self.next_multicast = after(now, interval);
        true
    }

    /// When [`RouterAdvertiser::poll`] next returns true, barring solicitations and MTU changes.
    pub fn next_due(&self) -> UnixTime {
        self.next_multicast
    }

    fn earliest_multicast(&self, now: UnixTime) -> UnixTime {
        self.last_multicast
            .map_or(now, |t| after(t, MIN_MULTICAST_GAP_MS).max(now))
    }

    fn due_by(&mut self, at: UnixTime) {
        self.next_multicast = self.next_multicast.min(at);
    }
}

/// Default routers tracked at once on the external link; a flood of advertisements from other
/// sources does not grow the table (the soonest to expire makes room).
pub const MAX_UPSTREAM_ROUTERS: usize = 4;

/// The external link's default routers and the MTU each advertises (RFC 4861 §6.3.4).
///
/// An advertisement with router lifetime 0 comes from a router that is not a default router
/// (or has stopped being one): its MTU option is not taken, and a lifetime 0 from a router in
/// the table removes it. A default router's MTU holds for its router lifetime from the last
/// advertisement, then lapses, as the router itself does for the hosts. MTU values below 1280
/// are ignored (§6.3.4: hosts copy the option only if it is at least the IPv6 minimum).
#[derive(Debug, Clone, Default)]
pub struct UpstreamRouters {
    routers: Vec<(Ipv6Addr, Option<u32>, UnixTime)>,
}

impl UpstreamRouters {
    /// An advertisement (already validated: hop limit 255, link-local source) from `src` with
    /// `lifetime` seconds and an MTU option `mtu`. True if the MTU it takes changed.
    pub fn on_advertisement(
        &mut self,
        now: UnixTime,
        src: Ipv6Addr,
        lifetime_secs: u16,
        mtu: Option<u32>,
    ) -> bool {
        let before = self.mtu(now);
        self.routers.retain(|(a, _, _)| *a != src);
        if lifetime_secs > 0 {
            if self.routers.len() >= MAX_UPSTREAM_ROUTERS {
                if let Some(i) = (0..self.routers.len()).min_by_key(|&i| self.routers[i].2) {
                    self.routers.swap_remove(i);
                }
            }
            let mtu = mtu.filter(|m| *m >= 1280);
            self.routers
                .push((src, mtu, after(now, u64::from(lifetime_secs) * 1_000)));
        }
        self.mtu(now) != before
    }

    /// The smallest MTU a default router advertises now, if any (expired routers are dropped).
    pub fn mtu(&mut self, now: UnixTime) -> Option<u32> {
        self.routers.retain(|(_, _, until)| *until > now);
        self.routers.iter().filter_map(|(_, m, _)| *m).min()
    }

    /// The default routers heard and not expired.
    pub fn count(&self) -> usize {
        self.routers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> UnixTime {
        UnixTime::from_nanos(1_700_000_000_000 * MS + ms * MS)
    }

    /// Every multicast sent between `from` and `to` ms, polling each ms.
    fn sends(a: &mut RouterAdvertiser, from: u64, to: u64) -> Vec<u64> {
        (from..to).filter(|&ms| a.poll(t(ms), ms as u32)).collect()
    }

    /// Finding: any link-local node could set the MTU, and it stuck. Only a default router's
    /// MTU counts, and only for its lifetime.
    #[test]
    fn upstream_mtu_only_from_default_routers_and_only_for_their_lifetime() {
        let r1: Ipv6Addr = "fe80::1".parse().unwrap();
        let r2: Ipv6Addr = "fe80::2".parse().unwrap();
        let node: Ipv6Addr = "fe80::bad".parse().unwrap();
        let mut u = UpstreamRouters::default();
        // Not a default router: nothing.
        assert!(!u.on_advertisement(t(0), node, 0, Some(1300)));
        assert_eq!(u.mtu(t(0)), None);
        // A default router for 30 s.
        assert!(u.on_advertisement(t(0), r1, 30, Some(1400)));
        assert_eq!(u.mtu(t(29_999)), Some(1400));
        assert_eq!(u.mtu(t(30_000)), None, "lapses with the router lifetime");
        // Refreshed by each advertisement; the smallest of two routers counts.
        u.on_advertisement(t(40_000), r1, 30, Some(1400));
        u.on_advertisement(t(41_000), r2, 1800, Some(1380));
        assert_eq!(u.mtu(t(42_000)), Some(1380));
        // A router that says lifetime 0 is no longer one.
        assert!(u.on_advertisement(t(43_000), r2, 0, Some(1380)));
        assert_eq!(u.mtu(t(43_000)), Some(1400));
        // No MTU option, or one below 1280: the router counts, its MTU does not.
        u.on_advertisement(t(44_000), r2, 1800, Some(1000));
        assert_eq!(u.mtu(t(44_000)), Some(1400));
        u.on_advertisement(t(44_000), r1, 1800, None);
        assert_eq!(u.mtu(t(44_000)), None);
        // A flood of "default routers" keeps the table bounded.
        for i in 0..100u16 {
            let a = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 1, i);
            u.on_advertisement(t(50_000), a, 10, Some(1300));
        }
        assert_eq!(u.count(), MAX_UPSTREAM_ROUTERS);
        assert_eq!(u.mtu(t(60_000)), None, "and each lapses");
    }

    #[test]
    fn three_quick_advertisements_then_minutes_apart() {
        let mut a = RouterAdvertiser::new(t(0), 1436);
        assert_eq!(sends(&mut a, 0, 40_000), vec![0, 16_000, 32_000]);
        let next = sends(&mut a, 40_000, 2_000_000);
        let gaps: Vec<u64> = std::iter::once(32_000)
            .chain(next.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .collect();
        assert!(!gaps.is_empty());
        for g in gaps {
            assert!((INTERVAL_MS.0..=INTERVAL_MS.1).contains(&g), "gap {g}");
        }
    }

    #[test]
    fn an_mtu_change_is_announced_at_once_but_never_within_three_seconds() {
        let mut a = RouterAdvertiser::new(t(0), 1436);
        assert!(a.poll(t(0), 0));
        a.set_mtu(t(1_000), 1436); // unchanged: nothing
        assert_eq!(a.next_due(), t(16_000));
        a.set_mtu(t(1_000), 1400);
        assert_eq!(a.mtu(), 1400);
        assert_eq!(a.next_due(), t(MIN_MULTICAST_GAP_MS));
        assert!(a.poll(t(3_000), 0));
        a.set_mtu(t(4_000), 1380);
        assert_eq!(a.next_due(), t(6_000), "spacing after the last one");
    }

    #[test]
    fn solicitations_are_answered_unicast_with_a_limit_or_by_multicast() {
        let mut a = RouterAdvertiser::new(t(0), 1436);
        assert!(a.poll(t(0), 0));
        let host: Ipv6Addr = "fe80::1".parse().unwrap();
        for i in 0..UNICAST_PER_SECOND {
            assert_eq!(
                a.on_solicitation(t(5_000 + u64::from(i)), host, 7),
                Some(host)
            );
        }
        // Over the limit: a multicast within 500 ms instead.
        assert_eq!(a.on_solicitation(t(5_100), host, 7), None);
        assert_eq!(a.next_due(), t(5_107));
        // A new second, a new allowance.
        assert_eq!(a.on_solicitation(t(6_000), host, 7), Some(host));
        // From the unspecified address: always multicast, spaced from the last one.
        let mut b = RouterAdvertiser::new(t(0), 1436);
        assert!(b.poll(t(0), 0));
        assert_eq!(b.on_solicitation(t(100), Ipv6Addr::UNSPECIFIED, 499), None);
        assert_eq!(b.next_due(), t(MIN_MULTICAST_GAP_MS));
        assert!(!b.poll(t(2_999), 0));
        assert!(b.poll(t(3_000), 0));
    }
}
