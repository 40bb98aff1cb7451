//! Keyed interface identifiers and ports: BLAKE3 in keyed mode, with subkeys from `derive_key`
//! (docs/PROTOCOL.md §2.2).
//!
//! `IID  = BLAKE3-keyed(address key, role (1) || true IID (8) || epoch (u64 BE) || attempt (1))[0..8]`
//! `port = 1024 + (u64 BE of BLAKE3-keyed(port key, role (1) || true IID (8) || epoch (u64 BE) [|| attempt (1)])[0..8]) mod 64512`
//! (the attempt byte only for a moved epoch, attempt offset > 0: docs/PROTOCOL.md §2.5, §5.2)

use std::net::Ipv6Addr;

use crate::key::Subkey;

fn prf(key: &Subkey, role: u8, true_addr: Ipv6Addr, epoch: u64, attempt: Option<u8>) -> [u8; 8] {
    let mut input = [0u8; 18];
    input[0] = role;
    input[1..9].copy_from_slice(&true_addr.octets()[8..]);
    input[9..17].copy_from_slice(&epoch.to_be_bytes());
    let len = match attempt {
        Some(a) => {
            input[17] = a;
            18
        }
        None => 17,
    };
    let h = blake3::keyed_hash(key.as_bytes(), &input[..len]);
    let mut out = [0; 8];
    out.copy_from_slice(&h.as_bytes()[..8]);
    out
}

/// The keyed-mode IID of the endpoint with `role` and `true_addr` in `epoch`.
pub fn keyed_iid(
    address_key: &Subkey,
    role: u8,
    true_addr: Ipv6Addr,
    epoch: u64,
    attempt: u8,
) -> [u8; 8] {
    prf(address_key, role, true_addr, epoch, Some(attempt))
}

/// Lowest hopping port: ports below 1024 are well-known and never used.
pub const PORT_MIN: u16 = 1024;
const PORT_SPAN: u64 = 65536 - PORT_MIN as u64;

/// The hopping UDP port of the endpoint with `role` and `true_addr` in `epoch` (1024..=65535)
/// at attempt offset `attempt_offset`. Offset 0 (every epoch that never moved) hashes 17 bytes,
/// as before moves existed; a moved epoch appends the offset, so a port that could not be bound
/// is left for another one on both sides (docs/PROTOCOL.md §5.2). The modulo bias is below
/// 2^-47 and is accepted.
pub fn keyed_port(
    port_key: &Subkey,
    role: u8,
    true_addr: Ipv6Addr,
    epoch: u64,
    attempt_offset: u8,
) -> u16 {
    let attempt = (attempt_offset > 0).then_some(attempt_offset);
    let v = u64::from_be_bytes(prf(port_key, role, true_addr, epoch, attempt));
    // v % PORT_SPAN < 64512, so the sum is at most 65535 and always fits.
    PORT_MIN + (v % PORT_SPAN) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::context;
    use crate::SessionKey;

    #[test]
    fn ports_stay_in_range_and_vary() {
        let key = SessionKey::from_bytes(&[3; 32]).unwrap();
        let pk = Subkey::derive(context::PORT, &key);
        let addr: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let ports: Vec<u16> = (0..2000).map(|e| keyed_port(&pk, 0, addr, e, 0)).collect();
        assert!(ports.iter().all(|&p| p >= PORT_MIN));
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert!(distinct.len() > 1900);
    }

    #[test]
    fn role_and_attempt_change_the_iid() {
        let key = SessionKey::from_bytes(&[3; 32]).unwrap();
        let ak = Subkey::derive(context::ADDRESS, &key);
        let addr: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let base = keyed_iid(&ak, 0, addr, 9, 0);
        assert_ne!(base, keyed_iid(&ak, 1, addr, 9, 0));
        assert_ne!(base, keyed_iid(&ak, 0, addr, 9, 1));
        assert_ne!(base, keyed_iid(&ak, 0, addr, 10, 0));
    }

    #[test]
    fn attempt_offset_moves_the_port_and_offset_zero_keeps_it() {
        let key = SessionKey::from_bytes(&[3; 32]).unwrap();
        let pk = Subkey::derive(context::PORT, &key);
        let addr: Ipv6Addr = "2001:db8::1".parse().unwrap();
        // Offset 0 is the 17-byte input of the original derivation.
        let v = u64::from_be_bytes(prf(&pk, 0, addr, 9, None));
        assert_eq!(
            keyed_port(&pk, 0, addr, 9, 0),
            PORT_MIN + (v % PORT_SPAN) as u16
        );
        let moved: std::collections::HashSet<u16> =
            (0..=4).map(|k| keyed_port(&pk, 0, addr, 9, k)).collect();
        assert_eq!(moved.len(), 5, "each offset gives its own port");
    }
}
