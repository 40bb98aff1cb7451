//! Thesis-compatible interface identifiers: Eq. 2.1 of 000 §2.5.2 with the inputs of 000 §3.1.1 and
//! §3.2.2 ("hashing the session key, current salt, source MAC address, and true source IPv6 address").
//!
//! `IID = SHA-256(true IID (8) || session key bytes || salt (u64 BE) [|| MAC (6)] [|| attempt (1)])[0..8]`
//!
//! The attempt byte is appended only when it is non-zero, so attempt 0 is exactly Eq. 2.1.

use std::net::Ipv6Addr;

use ring::digest;

use crate::SessionKey;

/// The thesis-mode IID of `true_addr` for `salt` (= the epoch number, docs/PROTOCOL.md §3).
pub fn thesis_iid(
    true_addr: Ipv6Addr,
    key: &SessionKey,
    salt: u64,
    mac: Option<[u8; 6]>,
    attempt: u8,
) -> [u8; 8] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(&true_addr.octets()[8..]);
    ctx.update(key.as_bytes());
    ctx.update(&salt.to_be_bytes());
    if let Some(mac) = mac {
        ctx.update(&mac);
    }
    if attempt != 0 {
        ctx.update(&[attempt]);
    }
    let d = ctx.finish();
    let mut iid = [0; 8];
    // SHA-256 digests are 32 bytes, so the first 8 always exist.
    iid.copy_from_slice(&d.as_ref()[..8]);
    iid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_zero_is_plain_eq_2_1() {
        // The vector is frozen in docs/PROTOCOL.md §8 and cross-checked there with `sha256sum`.
        let key = SessionKey::from_bytes(&[0x11; 32]).unwrap();
        let addr: Ipv6Addr = "2001:db8:c111::1".parse().unwrap();
        let a = thesis_iid(addr, &key, 170_000_000, None, 0);
        let b = thesis_iid(addr, &key, 170_000_000, None, 1);
        let c = thesis_iid(
            addr,
            &key,
            170_000_000,
            Some([0, 0xab, 0xcd, 0x11, 0x22, 1]),
            0,
        );
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, thesis_iid(addr, &key, 170_000_001, None, 0));
    }
}
