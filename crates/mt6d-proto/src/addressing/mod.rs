//! Hashed addresses and hopping ports: pure functions of (keys, endpoint, role, epoch, attempt).
//!
//! Owns the rules both peers must apply identically without talking (docs/PROTOCOL.md §2): role
//! assignment, reserved-IID avoidance, the equal-address tie-break and the port policy. It knows
//! nothing about time; [`crate::Stream`] turns `now` into an epoch first.

mod keyed;
mod reserved;
mod thesis;

use std::net::Ipv6Addr;

pub use keyed::{keyed_iid, keyed_port, PORT_MIN};
pub use reserved::is_reserved_iid;
pub use thesis::thesis_iid;

use crate::key::{context, Subkey};
use crate::{Derivation, Endpoint, Epoch, PortPolicy, SessionKey};

/// Which end of a stream an endpoint is. The endpoint whose true address is numerically lower is
/// [`Role::Low`] (0), the other [`Role::High`] (1): both gateways agree without exchanging anything,
/// and the two endpoints never feed the same input to the PRF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Role 0: numerically lower true address.
    Low = 0,
    /// Role 1: numerically higher true address.
    High = 1,
}

impl Role {
    /// The role of the endpoint with `this` true address facing `other`. Equal addresses are refused
    /// by [`crate::Stream::new`]; here they give `High` (no panic).
    pub fn of(this: Ipv6Addr, other: Ipv6Addr) -> Role {
        if this < other {
            Role::Low
        } else {
            Role::High
        }
    }
    /// The other end.
    pub fn peer(self) -> Role {
        match self {
            Role::Low => Role::High,
            Role::High => Role::Low,
        }
    }
    /// 0 or 1, as fed to the PRF.
    pub fn byte(self) -> u8 {
        self as u8
    }
}

/// The key material address and port derivation needs. Cheap to keep per stream.
#[derive(Clone, Debug)]
pub struct AddressKeys {
    session: SessionKey,
    address: Subkey,
    port: Subkey,
}

impl AddressKeys {
    /// One byte of each subkey mixed (see `Stream::touch`): brings both into the cache.
    pub(crate) fn touch(&self) -> u8 {
        self.address.as_bytes()[31] ^ self.port.as_bytes()[0]
    }

    /// Derives the address and port subkeys from the session key.
    pub fn derive(key: &SessionKey) -> Self {
        Self {
            session: key.clone(),
            address: Subkey::derive(context::ADDRESS, key),
            port: Subkey::derive(context::PORT, key),
        }
    }
}

/// A hashed address and the attempt number that produced it (0 unless a reserved IID, an
/// equal-address tie-break or an `attempt_offset` moved it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HashedAddr {
    /// The address.
    pub addr: Ipv6Addr,
    /// The attempt byte used.
    pub attempt: u8,
}

fn iid_for(
    keys: &AddressKeys,
    d: Derivation,
    ep: &Endpoint,
    role: Role,
    epoch: Epoch,
    attempt: u8,
) -> [u8; 8] {
    match d {
        Derivation::Thesis => thesis_iid(ep.true_addr, &keys.session, epoch.0, ep.mac, attempt),
        Derivation::Keyed => keyed_iid(&keys.address, role.byte(), ep.true_addr, epoch.0, attempt),
    }
}

fn with_prefix(ep: &Endpoint, iid: [u8; 8]) -> Ipv6Addr {
    let prefix = ep.external_prefix.unwrap_or(ep.true_addr).octets();
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&prefix[..8]);
    o[8..].copy_from_slice(&iid);
    Ipv6Addr::from(o)
}

/// First attempt >= `attempt_offset` whose address is acceptable, searching at most 256 attempts
/// (wrapping); `reject` adds a caller rule (the equal-address tie-break).
fn search(
    keys: &AddressKeys,
    d: Derivation,
    ep: &Endpoint,
    role: Role,
    epoch: Epoch,
    attempt_offset: u8,
    reject: impl Fn(Ipv6Addr) -> bool,
) -> HashedAddr {
    let mut attempt = attempt_offset;
    for _ in 0..=u8::MAX {
        let iid = iid_for(keys, d, ep, role, epoch, attempt);
        let addr = with_prefix(ep, iid);
        if !is_reserved_iid(iid) && !reject(addr) {
            return HashedAddr { addr, attempt };
        }
        attempt = attempt.wrapping_add(1);
    }
    // Unreachable in practice (every one of 256 hashes reserved or colliding); stay total and
    // deterministic instead of panicking.
    let iid = reserved::unreserve(iid_for(keys, d, ep, role, epoch, attempt_offset));
    HashedAddr {
        addr: with_prefix(ep, iid),
        attempt: attempt_offset,
    }
}

/// The hashed address of one endpoint in `epoch`, skipping reserved IIDs (RFC 5453) by incrementing
/// the attempt byte from `attempt_offset`. Does not apply the equal-address tie-break; use
/// [`route_addresses`] for a stream.
pub fn hashed_address(
    keys: &AddressKeys,
    derivation: Derivation,
    endpoint: &Endpoint,
    role: Role,
    epoch: Epoch,
    attempt_offset: u8,
) -> HashedAddr {
    search(
        keys,
        derivation,
        endpoint,
        role,
        epoch,
        attempt_offset,
        |_| false,
    )
}

/// Both endpoints' hashed addresses in `epoch`, indexed by role (`[low, high]`). If they come out
/// equal, the [`Role::High`] endpoint takes its next attempt.
pub fn route_addresses(
    keys: &AddressKeys,
    derivation: Derivation,
    low: &Endpoint,
    high: &Endpoint,
    epoch: Epoch,
    attempt_offset: u8,
) -> [HashedAddr; 2] {
    let a = hashed_address(keys, derivation, low, Role::Low, epoch, attempt_offset);
    let b = search(
        keys,
        derivation,
        high,
        Role::High,
        epoch,
        attempt_offset,
        |x| x == a.addr,
    );
    [a, b]
}

/// The outer UDP port of the endpoint with `role` in `epoch` at attempt offset `attempt_offset`
/// (0 unless the epoch moved, docs/PROTOCOL.md §5.2). Ports always come from the keyed PRF (the
/// thesis has no port hopping), whatever the address derivation; a fixed port never moves.
pub fn port(
    keys: &AddressKeys,
    policy: PortPolicy,
    endpoint: &Endpoint,
    role: Role,
    epoch: Epoch,
    attempt_offset: u8,
) -> u16 {
    match policy {
        PortPolicy::Fixed(p) => p,
        PortPolicy::Hopping => keyed_port(
            &keys.port,
            role.byte(),
            endpoint.true_addr,
            epoch.0,
            attempt_offset,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> AddressKeys {
        AddressKeys::derive(&SessionKey::from_bytes(&[0x42; 32]).unwrap())
    }

    #[test]
    fn roles() {
        let a: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8::2".parse().unwrap();
        assert_eq!(Role::of(a, b), Role::Low);
        assert_eq!(Role::of(b, a), Role::High);
        assert_eq!(Role::Low.peer(), Role::High);
    }

    #[test]
    fn prefix_is_kept_or_replaced() {
        let k = keys();
        let mut ep = Endpoint::new("2001:db8:1:2::99".parse().unwrap());
        let h = hashed_address(&k, Derivation::Keyed, &ep, Role::Low, Epoch(5), 0);
        assert_eq!(h.addr.segments()[..4], [0x2001, 0xdb8, 1, 2]);
        ep.external_prefix = Some("2001:db8:ff::".parse().unwrap());
        let h2 = hashed_address(&k, Derivation::Keyed, &ep, Role::Low, Epoch(5), 0);
        assert_eq!(h2.addr.segments()[..4], [0x2001, 0xdb8, 0xff, 0]);
        assert_eq!(h.addr.octets()[8..], h2.addr.octets()[8..]);
    }

    #[test]
    fn attempt_offset_moves_the_address() {
        let k = keys();
        let ep = Endpoint::new("2001:db8::1".parse().unwrap());
        for d in [Derivation::Thesis, Derivation::Keyed] {
            let h0 = hashed_address(&k, d, &ep, Role::Low, Epoch(7), 0);
            let h1 = hashed_address(&k, d, &ep, Role::Low, Epoch(7), 1);
            assert_eq!(h0.attempt, 0);
            assert_eq!(h1.attempt, 1);
            assert_ne!(h0.addr, h1.addr);
        }
    }

    #[test]
    fn equal_addresses_are_split() {
        // Thesis mode with two endpoints sharing an IID in the same /64 through external prefixes
        // hashes to the same address: role 1 must move.
        let k = keys();
        let low = Endpoint {
            true_addr: "2001:db8:1::5".parse().unwrap(),
            external_prefix: Some("2001:db8:9::".parse().unwrap()),
            mac: None,
        };
        let high = Endpoint {
            true_addr: "2001:db8:2::5".parse().unwrap(),
            ..low
        };
        let plain_high = hashed_address(&k, Derivation::Thesis, &high, Role::High, Epoch(1), 0);
        let [a, b] = route_addresses(&k, Derivation::Thesis, &low, &high, Epoch(1), 0);
        assert_eq!(a.addr, plain_high.addr);
        assert_ne!(a.addr, b.addr);
        assert_eq!(b.attempt, 1);
    }

    #[test]
    fn fixed_port() {
        let k = keys();
        let ep = Endpoint::new("2001:db8::1".parse().unwrap());
        assert_eq!(
            port(&k, PortPolicy::Fixed(4444), &ep, Role::High, Epoch(3), 2),
            4444
        );
        assert!(port(&k, PortPolicy::Hopping, &ep, Role::High, Epoch(3), 0) >= 1024);
    }
}
